"""The package's layout keeps each module small enough to read whole: no module of `jobq`
passes `MAX_LINES` lines (no database needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

import jobq

MAX_LINES = 400
PACKAGE = Path(jobq.__file__).parent


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_no_module_passes_the_line_limit(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(PACKAGE)} has {lines} lines: split it"
