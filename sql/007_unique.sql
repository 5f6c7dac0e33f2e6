-- Uniqueness made explicit (jobq.queue.model.Unique): per job, unique by type and arguments or
-- by an explicit key (within its job type), among queued jobs (`queued`), queued and running
-- ones (`active`), or within a period from the first enqueue (`period`); or not at all (`none`).

ALTER TABLE job
    ADD COLUMN unique_mode text NOT NULL DEFAULT 'queued'
        CHECK (unique_mode IN ('none', 'queued', 'active', 'period')),
    ADD COLUMN unique_key text CHECK (unique_key <> '' AND length(unique_key) <= 200);
ALTER TABLE job_running
    ADD COLUMN unique_mode text NOT NULL DEFAULT 'queued',
    ADD COLUMN unique_key text;

-- `queued`: at most one queued job per key, by the unique index on md5 (free: the insert that
-- queues a job checks it). The key is the job type and its explicit key, or its arguments (a
-- JSON object's text starts with '{', never '#': the two cannot meet).
ALTER TABLE job DROP COLUMN md5;
ALTER TABLE job ADD COLUMN md5 text GENERATED ALWAYS AS (
    CASE WHEN unique_mode = 'queued'
         THEN md5(job_type || coalesce('#' || unique_key, arguments::text)) END) STORED;
CREATE UNIQUE INDEX job_md5_key ON job (md5);

-- `active` and `period`: a key is held by one job, in a table of its own (the job moves between
-- tables; the key must not). A key is free again once its job is neither queued nor running
-- (`active`, `until` NULL) or once `until` has passed (`period`): the enqueue that finds it so
-- takes it over, so no statement that ends a job has anything to do. The pruner forgets the
-- keys that are free.
CREATE TABLE job_unique (
    md5    text        PRIMARY KEY,
    job_id bigint      NOT NULL,
    until  timestamptz
);

-- Whether job p_id is queued or running, read with a snapshot of its own (a volatile function's
-- statement, in READ COMMITTED): an enqueue that waited for a key's holder to commit sees that
-- holder's job, which its own statement's snapshot predates. One query, one snapshot: a job
-- moving between the two tables is seen in one of them.
CREATE FUNCTION job_is_active(p_id bigint) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RETURN EXISTS (SELECT FROM job WHERE id = p_id)
        OR EXISTS (SELECT FROM job_running WHERE id = p_id);
END $$;
