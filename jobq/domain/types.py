"""Field types shared by the request models."""

import re
from typing import Annotated

from pydantic import AfterValidator, AnyHttpUrl, BeforeValidator, ConfigDict, WithJsonSchema


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


Text = Annotated[str, AfterValidator(_no_nul)]
"""A string PostgreSQL can store (no NUL)."""

BIGINT_MAX = 2**63 - 1
"""The largest id PostgreSQL's `bigint` holds: larger ids name nothing (404)."""

_ID = re.compile(r"[0-9]{1,19}")


def parse_id(text: str) -> int | None:
    """The id that `text` spells in ASCII digits, from 1 to `BIGINT_MAX`; else None (another
    script's digits such as Arabic-Indic ones, superscripts such as `²`, a sign, blanks, 0, or
    a number no `bigint` holds)."""
    if not _ID.fullmatch(text):
        return None
    number = int(text)
    return number if 0 < number <= BIGINT_MAX else None


REQUEST = ConfigDict(extra="forbid")
"""Request bodies: unknown fields are errors. Strings are kept as sent: their lengths are the
raw lengths, as documented."""

NOT_BLANK = r"\S"
"""The pattern of a text that must hold something besides white space (searched anywhere, as
JSON Schema's `pattern` is)."""

HTTP_URL = r"^[Hh][Tt][Tt][Pp][Ss]?://"
"""The pattern of a webhook URL: `http://` or `https://`."""


def _http_url(value: object) -> object:
    if isinstance(value, str):
        if not re.match(HTTP_URL, value):
            raise ValueError("must start with http:// or https://")
        if len(value) > MAX_URL_LENGTH:
            raise ValueError(f"must be at most {MAX_URL_LENGTH} characters")
    return value


MAX_URL_LENGTH = 2000

WebhookUrl = Annotated[
    AnyHttpUrl,
    BeforeValidator(_http_url),
    WithJsonSchema(
        {
            "type": "string",
            "format": "uri",
            "pattern": HTTP_URL,
            "minLength": 1,
            "maxLength": MAX_URL_LENGTH,
        }
    ),
]
"""An `http` or `https` URL of at most 2000 characters, as sent."""
