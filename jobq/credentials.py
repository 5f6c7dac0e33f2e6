"""Credentials strong enough to trust: a Standard Webhooks secret (`whsec_` and at least 32
random bytes) and a bearer token (the admin token), with the messages that say how to make one.
`jobq.config.Settings` refuses weaker ones at start."""

from __future__ import annotations

import base64
import binascii

MIN_SECRET_BYTES = 32
WEAK_SECRET = (
    f"must be whsec_ and the base64 of at least {MIN_SECRET_BYTES} random bytes (Standard"
    ' Webhooks); make one with: python3 -c "import base64, secrets;'
    f" print('whsec_' + base64.b64encode(secrets.token_bytes({MIN_SECRET_BYTES})).decode())\""
    " (or leave it unset: jobq then makes one and keeps it in JOBQ_WEBHOOK_SECRET_FILE)"
)
"""Why a webhook secret is refused, and how to make one."""


def webhook_key(secret: str) -> bytes | None:
    """The key bytes of a Standard Webhooks secret (`whsec_` and base64, padding optional), or
    None when `secret` is not one or its key is under `MIN_SECRET_BYTES`."""
    encoded = secret.strip().removeprefix("whsec_")
    if not secret.startswith("whsec_") or not encoded:
        return None
    try:
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error:
        return None
    return key if len(key) >= MIN_SECRET_BYTES else None


MIN_TOKEN_LENGTH = 16
MIN_TOKEN_DISTINCT = 10
MAKE_TOKEN = 'python -c "import secrets; print(secrets.token_urlsafe(32))"'  # noqa: S105
"""The command that makes a strong token (43 characters, 256 random bits)."""


def strong_token(token: str) -> bool:
    """Whether `token` looks random enough for a bearer secret: at least `MIN_TOKEN_LENGTH`
    characters, `MIN_TOKEN_DISTINCT` of them different (`aaaaaaaaaaaaaaaa` and
    `abababababababab` are not; `secrets.token_urlsafe(32)` always is)."""
    return len(token) >= MIN_TOKEN_LENGTH and len(set(token)) >= MIN_TOKEN_DISTINCT
