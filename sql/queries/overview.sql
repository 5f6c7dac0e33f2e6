-- name: job_dead_count
-- Jobs in the dead letter, counted up to :max_count + 1 (a bigger dead letter shows "more than").
SELECT count(*) FROM (SELECT FROM job_dead LIMIT :max_count::bigint + 1) AS d;
