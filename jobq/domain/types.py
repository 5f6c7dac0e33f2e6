"""Field types shared by the request models."""

from typing import Annotated

from pydantic import AfterValidator, ConfigDict


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
"""A string PostgreSQL can store (no NUL)."""

BIGINT_MAX = 2**63 - 1
"""The largest id PostgreSQL's `bigint` holds: larger ids name nothing (404)."""

REQUEST = ConfigDict(extra="forbid", str_strip_whitespace=True)
"""Request bodies: unknown fields are errors; surrounding white space is dropped."""
