-- reminder_hold_take returns the hold's id alone (its functions/ file makes it anew).
DROP FUNCTION IF EXISTS reminder_hold_take(bigint, integer, timestamptz, interval);
