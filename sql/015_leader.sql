-- The fleet's leader: the one worker that runs the upkeep (rescue, pruning, schedules, the depth
-- snapshot), so that its cost does not grow with the number of workers. One row, taken and
-- renewed by the heartbeat statement itself (no statement of its own): a worker takes it when
-- its lease has run out (a hung leader) or its worker's liveness lock is gone (a dead one).
CREATE TABLE job_leader (
    id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
    worker_id  bigint      NOT NULL,
    expires_at timestamptz NOT NULL
);
