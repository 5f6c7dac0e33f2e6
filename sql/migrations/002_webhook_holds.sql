-- The per-address limits of webhook deliveries (jobq.domain.shares).
-- The reminder deliveries holding (or lately started on) a webhook address: the per-address
-- limits of deliveries (jobq.domain.shares), beside the per-user one of the queue. A delivery's
-- hold ends when its attempt ends, or at held_until (its attempt's deadline: a worker that died
-- leaves no hold past it); a row stays while its start is within the rate window.
CREATE TABLE webhook_hold (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- an IPv4 address, or the /64 of an IPv6 one
    address    text        NOT NULL,
    started_at timestamptz NOT NULL,
    held_until timestamptz NOT NULL
);

CREATE INDEX webhook_hold_address_idx ON webhook_hold (address);
