-- A sent one-off reminder counts its delivery (reminder_sent now does): those sent before.
UPDATE reminders SET deliveries = 1 WHERE rrule IS NULL AND sent_at IS NOT NULL AND deliveries = 0;
