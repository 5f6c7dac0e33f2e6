-- name: webhook_hold_take
-- Take a hold on one of webhook address :address's delivery slots at :now, held until
-- :held_until at the latest, within :max_running at once and :max_starts per :period
-- (webhook_hold_take in sql/functions). Returns one row: (hold_id, retry_at), see there.
SELECT hold_id, retry_at
FROM webhook_hold_take(:address, :now, :held_until, :max_running, :max_starts, :period);

-- name: webhook_hold_confirm!
-- Make hold :hold_id, taken with an asynchronous commit (webhook_hold_take), durable: a write
-- whose commit waits for the WAL flush, which covers every earlier commit. Alone, in autocommit,
-- before the hold's attempt starts.
UPDATE webhook_hold SET held_until = held_until WHERE id = :hold_id;

-- name: webhook_hold_release!
-- End hold :hold_id (its start still counts within the rate window: webhook_start).
DELETE FROM webhook_hold WHERE id = :hold_id;
