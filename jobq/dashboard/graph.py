"""A workflow's graph as the dashboard draws it (an SVG of its jobs and who waits for whom):
the jobs in columns by depth (the longest chain of jobs a job waits for), each coloured by its
state; a column of more than `MAX_PER_COLUMN` jobs is drawn as one box that counts them by
state. A pure function of the steps, so it is tested without a server."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from jobq.queue.workflows import StepView

MAX_PER_COLUMN = 12
"""A column with more jobs than this is one box (a fan-out of 10,000 stays readable)."""

BOX_W, BOX_H = 150, 34
GAP_X, GAP_Y = 60, 14
MARGIN = 10


@dataclass
class Box:
    """One box: a job (`job_id`), or a column's jobs counted by state (`job_id` None)."""

    x: int
    y: int
    label: str
    state: str
    job_id: int | None = None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def title(self) -> str:
        """The box's tooltip: its job, or its counts."""
        if self.job_id is not None:
            return f"job {self.job_id}: {self.label} ({self.state})"
        return ", ".join(f"{n} {state}" for state, n in sorted(self.counts.items()))


@dataclass
class Graph:
    """Boxes, edges (x1, y1, x2, y2: from a job's box to the box of a job that waits for it) and
    the drawing's size."""

    boxes: list[Box]
    edges: list[tuple[int, int, int, int]]
    width: int
    height: int


def depths(steps: Sequence[StepView]) -> dict[int, int]:
    """Each job's column: 0 for a job that waits for none (or only for jobs not listed), else
    one more than the deepest job it waits for."""
    waits = {s.job_id: list(s.depends_on) for s in steps}
    found: dict[int, int] = {}
    for start in waits:
        stack = [start]
        while stack:
            job = stack[-1]
            pending = [d for d in waits[job] if d in waits and d not in found]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            found[job] = 1 + max((found[d] for d in waits[job] if d in waits), default=-1)
    return found


def layout(steps: Sequence[StepView]) -> Graph:
    """The graph of `steps` (a workflow's jobs, as `find_workflow` gives them)."""
    column_of = depths(steps)
    columns: dict[int, list[StepView]] = {}
    for step in sorted(steps, key=lambda s: s.job_id):
        columns.setdefault(column_of[step.job_id], []).append(step)
    box_of: dict[int, Box] = {}
    boxes: list[Box] = []
    tallest = 0
    for column, members in sorted(columns.items()):
        x = MARGIN + column * (BOX_W + GAP_X)
        if len(members) > MAX_PER_COLUMN:
            counts = Counter(str(s.state) for s in members)
            state = (
                "running"
                if counts.keys() - {"succeeded", "failed", "cancelled"}
                else ("failed" if counts["failed"] or counts["cancelled"] else "succeeded")
            )
            box = Box(x, MARGIN, f"{len(members)} jobs", state, None, dict(counts))
            boxes.append(box)
            box_of.update({s.job_id: box for s in members})
            tallest = max(tallest, 1)
            continue
        for row, step in enumerate(members):
            label = step.step or step.job_type
            box = Box(x, MARGIN + row * (BOX_H + GAP_Y), label, str(step.state), step.job_id)
            boxes.append(box)
            box_of[step.job_id] = box
        tallest = max(tallest, len(members))
    edges = sorted(
        {
            (a.x + BOX_W, a.y + BOX_H // 2, b.x, b.y + BOX_H // 2)
            for step in steps
            for dep in step.depends_on
            if dep in box_of
            for a, b in [(box_of[dep], box_of[step.job_id])]
            if a is not b
        }
    )
    width = 2 * MARGIN + max(len(columns), 1) * (BOX_W + GAP_X) - GAP_X
    height = 2 * MARGIN + max(tallest, 1) * (BOX_H + GAP_Y) - GAP_Y
    return Graph(boxes, edges, width, height)
