-- The starts of deliveries to a webhook address get a table of their own, numbered by address, so
-- that a take counts the starts in the rate window from the first and the last one instead of
-- reading every row of the address, and drops the starts before the window from where its rows
-- begin (kept_from) instead of from the first its index still holds; a hold's row now goes when
-- its attempt ends, and keeps no start of its own (sql/functions/webhook_hold_take.sql).
CREATE TABLE webhook_start (
    address    text        NOT NULL,
    started_at timestamptz NOT NULL,
    start_no   bigint      NOT NULL,
    kept_from  timestamptz NOT NULL,
    PRIMARY KEY (address, started_at, start_no)
);
INSERT INTO webhook_start (address, started_at, start_no, kept_from)
SELECT address, started_at, row_number() OVER (PARTITION BY address ORDER BY started_at, id),
       min(started_at) OVER (PARTITION BY address)
FROM webhook_hold;
ALTER TABLE webhook_hold DROP COLUMN started_at;
