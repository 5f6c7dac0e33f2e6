"""jobq: a Quart web service whose PostgreSQL database is also its job queue."""
