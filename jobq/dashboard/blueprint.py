"""The dashboard's blueprint, with the routes of every page (`views`, `lists`, `workflows`)."""

from jobq.dashboard import lists, workflows  # their pages are routes of `bp`
from jobq.dashboard.views import bp

__all__ = ["bp", "lists", "workflows"]
