-- Workers are now woken by a NOTIFY sent after the enqueuing transaction commits
-- (jobq.queue.notify): a NOTIFY inside it made concurrent enqueues commit one at a time.
DROP TRIGGER job_notify ON job;
DROP FUNCTION job_notify();
