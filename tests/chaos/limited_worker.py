"""Imported by the workers of the limits scenario (`JOBQ_JOB_MODULES`): the chaos handler, and
the limited queue declared in the process's registry (which the worker writes to `job_queue`)."""

from jobq.queue.registry import registry
from tests.chaos import limited
from tests.toolkit import handlers

__all__ = ["handlers"]

limited.declare(registry)
