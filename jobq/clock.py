"""The one clock. Every time-based decision uses `now()` and passes it to SQL as a parameter."""

from datetime import UTC, datetime


def now() -> datetime:
    """Return the current time as an aware UTC datetime (moved by freezegun in tests)."""
    return datetime.now(UTC)
