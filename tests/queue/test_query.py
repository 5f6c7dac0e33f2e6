"""Named parameters (`jobq.statements.Query`): numbered in order, casts untouched, and every
statement (the queue's and the application's) left with no unnumbered name; the application's
code reads no table of the queue (no database needed)."""

from __future__ import annotations

import re
from pathlib import Path

import aiosql
import pytest

import jobq
from jobq.statements import QUERIES_DIR, STATEMENTS, Query, _Verbatim, load


def test_names_are_numbered_in_order_of_first_use_and_casts_are_kept() -> None:
    query = Query("SELECT :b::int, :a::text[], x::date, :b + 1, arr[1:(:a)]")
    assert query.text == "SELECT $1::int, $2::text[], x::date, $1 + 1, arr[1:($2)]"
    assert query.params == ("b", "a")
    assert query.args(a="A", b="B") == ["B", "A"]


@pytest.mark.parametrize("values", [{"a": 1}, {"a": 1, "b": 2, "c": 3}])
def test_a_missing_or_unknown_parameter_is_a_type_error(values: dict[str, int]) -> None:
    with pytest.raises(TypeError, match="parameters missing"):
        Query("SELECT :a, :b").args(**values)


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_every_statement_is_fully_numbered(name: str) -> None:
    query = STATEMENTS[name]
    # no `:name` left (a cast is `::type`), and $1..$n each used
    assert not re.search(r"(?<![:\w]):[a-z_]", query.text), query.text
    used = {int(n) for n in re.findall(r"\$(\d+)", query.text)}
    assert used == set(range(1, len(query.params) + 1)), (name, used, query.params)


def test_the_loader_reads_each_block_as_aiosql_does(tmp_path: Path) -> None:
    """`load` skips aiosql's search for /* */ comments in a file without one: the blocks it
    reads are aiosql's own, in the project's files and in a file with such a comment."""
    (tmp_path / "c.sql").write_text(
        "-- name: c_one\n-- One.\nSELECT /* a comment */ :a;\n\n"
        "-- name: c_two!\n-- Two.\nUPDATE t SET x = '/* kept */' WHERE y = :b;\n"
    )
    for directory in (QUERIES_DIR, tmp_path):
        theirs = aiosql.from_path(directory, _Verbatim, mandatory_parameters=False)  # type: ignore[arg-type]
        ours = load(directory)
        names = set(theirs.available_queries)
        assert set(ours) == names - {f"{name}_cursor" for name in names}  # aiosql's variants
        for name, query in ours.items():
            assert query.source == getattr(theirs, name).sql.strip().rstrip(";"), name
    assert load(tmp_path)["c_one"].source == "SELECT  :a"
    assert load(tmp_path)["c_two"].source == "UPDATE t SET x = '/* kept */' WHERE y = :b"


DOMAIN_TABLES = {
    "users",
    "reminders",
    "reminder_quotas",
    "reminder_holds",
    "reminder_hold_take",  # a function of the domain's, read as a table
    "exports",
    "export_parts",
    "api_keys",
    "dashboard_session",
    "webhook_hold",
    "webhook_hold_take",  # the delivery shares' function (jobq.domain.shares)
}
APPLICATION = sorted(
    path
    for package in ("api", "dashboard", "domain", "jobs")
    for path in (Path(jobq.__file__).parent / package).glob("*.py")
)


@pytest.mark.parametrize("path", APPLICATION, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_application_reads_no_table_of_the_queue(path: Path) -> None:
    # It asks the queue (`jobq.queue.control.job_states`, ...): its statements name its tables.
    source = path.read_text()
    assert not re.search(r"[\"']\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\s", source), "SQL in Python"
    assert not re.search(r"jobq\.queue\.sql|from jobq\.queue import [^\n]*\bsql\b", source)
    for name in re.findall(r"\bstatements\.(\w+)", source):
        text = STATEMENTS[name].text
        tables = set(re.findall(r"\b(?:FROM|JOIN|INTO|UPDATE)\s+(\w+)", text, re.I))
        ctes = set(re.findall(r"\b(\w+)\s+AS\s+\(", text, re.I))
        assert tables - ctes <= DOMAIN_TABLES, (name, tables)
