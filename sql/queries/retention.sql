-- name: job_day_partitions
-- :parent (job_done or job_attempt). Its partitions but the default one, named `<parent>_p<day>`.
SELECT c.relname FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = :parent::text::regclass
  AND c.relname LIKE replace(:parent, '_', '\_') || '\_p%'
ORDER BY c.relname;

-- name: job_done_prune_default
-- :cutoff, :batch. Delete up to `batch` rows of the default partitions finished (failed) before
-- `cutoff`; returns how many.
WITH gone AS (
    DELETE FROM job_done_default WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM job_done_default WHERE finished_at < :cutoff LIMIT :batch))
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: job_attempt_prune_default
WITH gone AS (
    DELETE FROM job_attempt_default WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM job_attempt_default WHERE failed_at < :cutoff LIMIT :batch))
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: job_unique_prune
-- :now, :batch. Forget up to `batch` keys of job_unique that are free (their period is over, or
-- their job is neither queued nor running); returns how many.
WITH gone AS (
    DELETE FROM job_unique WHERE ctid = ANY(ARRAY(
        SELECT u.ctid FROM job_unique AS u
        WHERE CASE WHEN u.until IS NULL THEN NOT job_is_active(u.job_id)
                   ELSE u.until <= :now END
        LIMIT :batch))
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: job_occurrence_prune
-- :cutoff, :batch. Forget up to `batch` occurrences older than `cutoff` (a schedule never goes
-- back that far); returns how many.
WITH gone AS (
    DELETE FROM job_occurrence WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM job_occurrence WHERE at < :cutoff LIMIT :batch))
    RETURNING 1
)
SELECT count(*) FROM gone;

-- name: job_trace_prune
-- Forget up to :batch trace contexts written before :cutoff; returns how many.
WITH gone AS (
    DELETE FROM job_trace WHERE job_id = ANY(ARRAY(
        SELECT job_id FROM job_trace WHERE created_at < :cutoff LIMIT :batch))
    RETURNING 1
)
SELECT count(*) FROM gone;
