"""The examples of the workflows guide (`docs/guides/workflows.md`) run as written: each python
block after an `<!-- example: NAME -->` line defines `example_NAME(database)`, run here
against the test database."""

from __future__ import annotations

import re
from typing import Any

import pytest

from jobq.config import PROJECT_ROOT
from jobq.db import Database

GUIDE = PROJECT_ROOT / "docs" / "guides" / "workflows.md"
EXAMPLE = re.compile(r"<!-- example: (\w+) -->\n```python\n(.*?)\n```\n", re.DOTALL)


def examples() -> dict[str, str]:
    """Each example's code, by name."""
    found = {m[1]: m[2] for m in EXAMPLE.finditer(GUIDE.read_text(encoding="utf-8"))}
    assert found, f"{GUIDE} has no example"
    return found


def test_the_guide_has_its_four_examples() -> None:
    assert set(examples()) == {"workflow", "batch", "sequence", "progress"}


@pytest.mark.parametrize("name", sorted(examples()))
async def test_the_example_runs_as_written(database: Database, name: str) -> None:
    code = compile(examples()[name], f"{GUIDE.name} ({name})", "exec", dont_inherit=True)
    namespace: dict[str, Any] = {"__name__": f"workflows_example_{name}"}
    exec(code, namespace)  # noqa: S102 (the guide's own example, read from the repository)
    await namespace[f"example_{name}"](database)
