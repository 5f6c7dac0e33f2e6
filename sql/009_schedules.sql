-- Recurring schedules (jobq.queue.schedule): declared in code (`source` 'code', synchronised at
-- every worker's start) or made at run time (recurring reminders, `source` 'reminder').
-- Every worker's scheduler enqueues, ahead of time, the occurrences due within its look-ahead:
-- each schedule's row is locked while its occurrences are enqueued and `next_at` advanced, in
-- one transaction, and each occurrence is a row of job_occurrence (primary key: schedule and
-- time) written in that same transaction: an occurrence makes one job, whoever looks.
CREATE TABLE job_schedule (
    name            text PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 200),
    source          text NOT NULL CHECK (source IN ('code', 'reminder')),
    job_type        text NOT NULL,
    arguments       jsonb NOT NULL CHECK (jsonb_typeof(arguments) = 'object'),
    -- an argument set to each occurrence's time (ISO 8601, UTC), when named
    occurrence_arg  text,
    queue           text,
    -- exactly one of: a cron expression, a fixed interval, an RFC 5545 RRULE
    cron            text,
    every_s         double precision CHECK (every_s >= 1),
    rrule           text,
    tz              text NOT NULL,
    -- an RRULE's first occurrence (its DTSTART); an interval's anchor
    starts_at       timestamptz,
    misfire         text NOT NULL CHECK (misfire IN ('skip', 'one', 'backfill')),
    backfill        integer CHECK (backfill > 0),
    paused          boolean NOT NULL DEFAULT false,
    -- the next occurrence not enqueued yet (NULL: the schedule has ended)
    next_at         timestamptz,
    -- what the declaration was when next_at was computed (code schedules: changed or not)
    spec            text NOT NULL,
    CHECK ((cron IS NOT NULL)::int + (every_s IS NOT NULL)::int + (rrule IS NOT NULL)::int = 1)
);
CREATE INDEX job_schedule_next_idx ON job_schedule (next_at) WHERE NOT paused;

CREATE TABLE job_occurrence (
    schedule text        NOT NULL,
    at       timestamptz NOT NULL,
    job_id   bigint      NOT NULL,
    PRIMARY KEY (schedule, at)
);
CREATE INDEX job_occurrence_at_idx ON job_occurrence (at);
