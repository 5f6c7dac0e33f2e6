"""Named parameters (`jobq.queue.sql.Query`): numbered in order, casts untouched, and every
statement of the engine left with no unnumbered name (no database needed)."""

from __future__ import annotations

import re

import pytest

from jobq.queue import sql
from jobq.queue.sql import Query


def test_names_are_numbered_in_order_of_first_use_and_casts_are_kept() -> None:
    query = Query("SELECT :b::int, :a::text[], x::date, :b + 1, arr[1:(:a)]")
    assert query.text == "SELECT $1::int, $2::text[], x::date, $1 + 1, arr[1:($2)]"
    assert query.params == ("b", "a")
    assert query.args(a="A", b="B") == ["B", "A"]


@pytest.mark.parametrize("values", [{"a": 1}, {"a": 1, "b": 2, "c": 3}])
def test_a_missing_or_unknown_parameter_is_a_type_error(values: dict[str, int]) -> None:
    with pytest.raises(TypeError, match="parameters missing"):
        Query("SELECT :a, :b").args(**values)


STATEMENTS = sql.STATEMENTS


@pytest.mark.parametrize("name", sorted(STATEMENTS))
def test_every_statement_is_fully_numbered(name: str) -> None:
    query = STATEMENTS[name]
    # no `:name` left (a cast is `::type`), and $1..$n each used
    assert not re.search(r"(?<![:\w]):[a-z_]", query.text), query.text
    used = {int(n) for n in re.findall(r"\$(\d+)", query.text)}
    assert used == set(range(1, len(query.params) + 1)), (name, used, query.params)
