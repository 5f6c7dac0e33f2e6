"""What `python -m jobq <command> --help` says: each command's summary (in the list of
commands), description and examples."""

from __future__ import annotations

import textwrap

SUMMARY = {
    "run": "serve the API with web and worker processes (make run)",
    "serve": "one web process: the API, the dashboard, /metrics",
    "worker": "one worker process (run as many as you like)",
    "migrate": "apply the migrations",
    "check": "verify the queue's invariants; JSON report",
    "db-stop": "stop the embedded PostgreSQL",
    "sql": "list jobq's SQL statements, or print one",
    "enqueue": "enqueue a job; prints its id",
    "jobs": "any job: list, show, cancel, retry",
    "dead": "the dead letter: list, retry, discard",
    "queues": "queues: list, pause, resume",
    "schedules": "recurring schedules: list",
    "workers": "the registered worker processes",
    "top": "a live view of queues, workers and rates (Ctrl-C quits)",
    "prune": "drop finished jobs past the retention now",
    "stats": "counts per job type; vacuum figures",
}
"""Per command: its line in `python -m jobq --help`."""

HELP: dict[str, tuple[str, str]] = {
    "run": (
        "Serve the API on JOBQ_HTTP_HOST:JOBQ_HTTP_PORT with its workers: apply the migrations, "
        "bind the socket, then supervise JOBQ_WEB_PROCESSES web and JOBQ_WORKER_PROCESSES "
        "worker processes (one of each per CPU by default), restarting those that die. "
        "SIGTERM or Ctrl-C stops them gracefully (running jobs get JOBQ_DRAIN_TIMEOUT_S).",
        """python -m jobq run
  JOBQ_HTTP_PORT=9000 JOBQ_WORKER_PROCESSES=4 python -m jobq run
  DATABASE_URL=postgresql://app@db:5432/jobq python -m jobq run""",
    ),
    "serve": (
        "One web process (hypercorn): the API, the dashboard and /metrics, with a worker in "
        "the process unless JOBQ_RUN_WORKERS=false. `run` starts these for you.",
        """python -m jobq serve
  JOBQ_RUN_WORKERS=false JOBQ_HTTP_PORT=8001 python -m jobq serve""",
    ),
    "worker": (
        "One worker process: claims and runs jobs of the queues in JOBQ_QUEUES (all declared "
        "ones by default) until SIGTERM or Ctrl-C, then drains. Start as many as you like, on "
        "any host that reaches the database.",
        """python -m jobq worker
  JOBQ_QUEUES=exports:2,default:8 python -m jobq worker
  JOBQ_JOB_MODULES=myapp.jobs python -m jobq worker""",
    ),
    "migrate": (
        "Apply the migrations of sql/migrations/ not yet applied, and re-create the functions "
        "of sql/functions/ (every process does this at its start too).",
        """python -m jobq migrate
  DATABASE_URL=postgresql://app@db:5432/jobq python -m jobq migrate""",
    ),
    "check": (
        "Verify the queue's invariants (each job in one table, no job past its attempts, the "
        "jobs of dead workers rescued in time, ...) and print the report as JSON; exit 1 when "
        "one fails. Reads only.",
        """python -m jobq check
  python -m jobq check --rescue-grace-s 30 | jq .ok""",
    ),
    "db-stop": (
        "Stop the embedded PostgreSQL (the one started when DATABASE_URL is unset); its data "
        "stays in JOBQ_PGDATA_DIR (.pgdata/).",
        """python -m jobq db-stop
  python -m jobq db-stop && rm -rf .pgdata    # start over with an empty database""",
    ),
    "sql": (
        "Every statement jobq sends lives in sql/queries/*.sql as a named block: without a "
        "name, list their names; with one, print it whole with its parameters.",
        """python -m jobq sql
  python -m jobq sql job_claim
  python -m jobq sql | grep ^reminder_""",
    ),
    "enqueue": (
        "Enqueue a job; print its id (and whether an identical one was queued already). A job "
        "type that no handler serves (JOBQ_JOB_MODULES) is refused unless --force.",
        """python -m jobq enqueue send_reminder --args '{"reminder_id": 7}'
  python -m jobq enqueue render_export --args '{"export_id": 3}' --in 60 --priority 5
  python -m jobq enqueue other.app.job --args '{}' --force --at 2030-01-01T09:00:00Z""",
    ),
    "jobs": (
        "Any job wherever it is (queued, running, finished, dead): list, show, cancel, retry.",
        """python -m jobq jobs list --state failed --limit 20
  python -m jobq jobs show 42
  python -m jobq jobs cancel 42        # again: "job 42 was cancelled already"
  python -m jobq jobs retry 42 --json""",
    ),
    "dead": (
        "The dead letter: jobs whose retries ran out. List them, put them back in their queue "
        "(attempts reset), or discard them.",
        """python -m jobq dead list
  python -m jobq dead retry 42
  python -m jobq dead retry --all
  python -m jobq dead discard 42""",
    ),
    "queues": (
        "Queues: depth, running jobs, limits; pause one (no worker claims its jobs) or resume.",
        """python -m jobq queues list
  python -m jobq queues pause exports
  python -m jobq queues resume exports""",
    ),
    "schedules": (
        "Recurring schedules (code and reminders) with their next occurrence.",
        """python -m jobq schedules list
  python -m jobq schedules list --json""",
    ),
    "workers": (
        "The registered worker processes: host, pid, alive (by the rescue's rule), last "
        "heartbeat, running jobs.",
        """python -m jobq workers
  python -m jobq workers --json""",
    ),
    "top": (
        "A live view of the queues (depth, running, jobs/s enqueued, succeeded and failed), "
        "the workers and the dead letter, refreshed every --interval seconds until Ctrl-C.",
        """python -m jobq top
  python -m jobq top --interval 5
  python -m jobq top --once            # one frame, then exit (scripts)""",
    ),
    "workflows": (
        "Workflows and batches, newest first, with their jobs counted by outcome.",
        """python -m jobq workflows
  python -m jobq workflows --unfinished --limit 20""",
    ),
    "workflow": (
        "One workflow (or batch) and its jobs; --cancel cancels every job not ended, --retry "
        "runs its failed and cancelled jobs again.",
        """python -m jobq workflow 12
  python -m jobq workflow 12 --cancel
  python -m jobq workflow 12 --retry""",
    ),
    "prune": (
        "Drop the finished jobs older than the retention now (the leader does it every "
        "JOBQ_PRUNE_INTERVAL_S anyway).",
        """python -m jobq prune
  python -m jobq prune --retention-s 3600""",
    ),
    "stats": (
        "Counts per job type (ripe, scheduled, running, dead) and the queue tables' vacuum "
        "figures.",
        """python -m jobq stats
  python -m jobq stats --json""",
    ),
}
"""Per command: (description, examples)."""


def description(command: str) -> str:
    """The description of `command`, wrapped for a terminal."""
    return textwrap.fill(HELP[command][0], width=88)


def epilog(command: str) -> str:
    """The examples of `command`, as its help's closing section."""
    return "examples:\n  " + HELP[command][1]
