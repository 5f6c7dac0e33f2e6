-- job_running is small (at most the slots of the live workers) and churns: every job is
-- inserted and deleted once. Each index costs an insert per job; the rescue and heartbeat find
-- their rows by token or by scanning this small table, so these two indexes only cost.
DROP INDEX job_running_worker_idx;
DROP INDEX job_running_lease_idx;

-- Queue tables churn: vacuum them after a fixed number of dead rows, not a fraction of the
-- table, so that dead tuples and index bloat stay bounded whatever the queue's size.
ALTER TABLE job SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 10000,
                     autovacuum_vacuum_insert_scale_factor = 0,
                     autovacuum_vacuum_insert_threshold = 10000);
ALTER TABLE job_running SET (autovacuum_vacuum_scale_factor = 0,
                             autovacuum_vacuum_threshold = 1000);
