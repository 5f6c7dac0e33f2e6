"""`python -m jobq workflows` and `python -m jobq workflow ID`: workflows and batches from a
shell (see `jobq.cli` for the output, the exit codes and the audit log).

    workflows [--unfinished] [--limit N] [--after ID]
    workflow ID [--cancel | --retry]

`workflow ID --cancel` and `--retry` say what they did on stderr, then show the workflow.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from jobq import clock, db
from jobq.cli.commands import OK, audit, emit
from jobq.cli.tables import table
from jobq.config import Settings
from jobq.queue import workflows

COMMANDS = ("workflows", "workflow")

LIST_COLUMNS = (
    "id", "name", "state", "num_jobs", "succeeded", "failed", "cancelled", "unfinished",
    "created_at", "finished_at",
)  # fmt: skip
STEP_COLUMNS = ("job_id", "step", "job_type", "queue", "state", "progress", "depends_on")


def add_commands(
    first: Any,
    leaf: Callable[..., argparse.ArgumentParser],
    page: Callable[[argparse.ArgumentParser], None],
    positive: Callable[[str], int],
) -> None:
    """Add `workflows` and `workflow` to the command parsers `first` (with `jobq.cli`'s
    `leaf`, `page` and `positive`)."""
    sub = leaf(
        first, "workflows", workflows_list, "workflows and batches, newest first", "workflows"
    )
    sub.add_argument("--unfinished", action="store_true", help="only those not ended")
    page(sub)
    sub = leaf(
        first, "workflow", workflow_show, "one workflow and its jobs; cancel, retry", "workflow"
    )
    sub.add_argument("id", type=positive)
    action = sub.add_mutually_exclusive_group()
    action.add_argument("--cancel", action="store_true", help="cancel every job not ended")
    action.add_argument("--retry", action="store_true", help="run its failed jobs again")


async def workflows_list(args: argparse.Namespace, settings: Settings) -> int:
    """A page of workflows (`jobq.queue.workflows.list_workflows`)."""
    async with db.transaction(readonly=True) as conn:
        found = await workflows.list_workflows(
            conn, limit=args.limit, after=args.after, unfinished=args.unfinished
        )
    rows = [w.model_dump(exclude={"steps", "more_steps"}) for w in found]
    emit(args, rows, table(rows, LIST_COLUMNS) if rows else "no workflow")
    return OK


async def workflow_show(args: argparse.Namespace, settings: Settings) -> int:
    """One workflow with its jobs; with `--cancel` or `--retry`, that first."""
    now = clock.now()
    if args.cancel:
        async with db.transaction() as conn:
            counts = await workflows.cancel_workflow(conn, args.id, now=now)
        audit("workflow.cancel", f"workflow:{args.id}")
        print(f"jobq: cancelled {counts}", file=sys.stderr, flush=True)
    elif args.retry:
        async with db.transaction() as conn:
            again = await workflows.retry_workflow(conn, args.id, now=now)
        audit("workflow.retry", f"workflow:{args.id} ({len(again)} jobs)")
        print(f"jobq: made again {len(again)} jobs", file=sys.stderr, flush=True)
    async with db.transaction(readonly=True) as conn:
        view = await workflows.find_workflow(conn, args.id, now=clock.now())
    head = view.model_dump(exclude={"steps", "more_steps"})
    steps = [s.model_dump() for s in view.steps]
    text = "\n".join(
        [
            table([head], LIST_COLUMNS),
            "",
            table(steps, STEP_COLUMNS) if steps else "no job listed",
            *(["(more jobs not listed: --json has the first 2,000)"] if view.more_steps else []),
        ]
    )
    emit(args, view.model_dump(), text)
    return OK
