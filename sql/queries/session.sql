-- name: database_ping
-- Whether the database answers (the health check).
SELECT 1;

-- name: setting_local
-- Set run-time setting :setting (`statement_timeout`, `lock_timeout`) to :value (text, in the
-- setting's unit: '250' is 250 ms) until the transaction ends.
SELECT set_config(:setting, :value, true);
