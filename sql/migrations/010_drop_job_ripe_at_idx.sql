-- A queue's reads by time go through job_claim_idx one priority at a time (job_priorities): an
-- index by (queue, ripe_at) let a plan serve one priority's scan of the claim by stepping over
-- every ripe job of the other priorities.
DROP INDEX IF EXISTS job_ripe_at_idx;
