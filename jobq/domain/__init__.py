"""Business rules: users, reminders and exports. Functions run in the caller's transaction."""
