-- Recurring reminders: a reminder with an RRULE is delivered at each occurrence, by a schedule
-- of its own in job_schedule (name 'reminder:<id>', jobq.domain.reminders).
ALTER TABLE reminders
    ADD COLUMN rrule text,
    ADD COLUMN tz text,
    ADD COLUMN until timestamptz,
    ADD COLUMN count integer CHECK (count > 0),
    ADD COLUMN paused boolean NOT NULL DEFAULT false,
    -- occurrences delivered, and the latest of them
    ADD COLUMN deliveries integer NOT NULL DEFAULT 0,
    ADD COLUMN last_occurrence_at timestamptz;

-- The concurrency key of a schedule's jobs (a reminder's: its webhook's host).
ALTER TABLE job_schedule ADD COLUMN concurrency_key text;
