"""Webhook signatures, by the Standard Webhooks specification (standardwebhooks.com).

Each delivery carries three headers: `webhook-id` (the delivery's id: the same on every retry
of one delivery, so a receiver can drop a replay or a second run), `webhook-timestamp` (the
attempt's time, Unix seconds) and `webhook-signature` (`v1,` and the base64 HMAC-SHA256, under
the secret's key, of `<id>.<timestamp>.<body>`). The `standardwebhooks` package signs; its
verifier (any language's) checks a delivery and refuses one whose timestamp is more than five
minutes from its clock, so a captured delivery cannot be replayed later.

The secret is `Settings.webhook_secret` (`whsec_` and base64, refused at start when weak), or,
when unset, one made at the first start and kept in `Settings.webhook_secret_file`
(`with_secret`), so that a fresh `make run` signs with a strong secret of its own.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import os
import secrets
import tempfile
from datetime import datetime
from pathlib import Path

from pydantic import SecretStr
from standardwebhooks import Webhook

from jobq.config import Settings
from jobq.credentials import MIN_SECRET_BYTES, WEAK_SECRET, webhook_key

log = logging.getLogger(__name__)


def signature_headers(secret: str, msg_id: str, body: bytes, at: datetime) -> dict[str, str]:
    """The Standard Webhooks headers of a delivery of `body` (UTF-8 JSON) with id `msg_id`,
    sent at `at` (aware): `webhook-id`, `webhook-timestamp`, `webhook-signature`."""
    signature = Webhook(secret).sign(msg_id, at, body.decode())
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


def new_secret() -> str:
    """A new secret: `whsec_` and the base64 of `MIN_SECRET_BYTES` random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(MIN_SECRET_BYTES)).decode()


def kept_secret(path: Path) -> tuple[str, bool]:
    """The secret kept in `path`, made and written there first (mode 0600, atomically: of two
    processes starting together, one writes and both read the same) when the file does not
    exist. Returns it and whether it was made now. Raises: `ValueError` when the file holds no
    valid secret; `OSError` when it cannot be read or written."""
    made = False
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # A draft of its own for each caller (mkstemp: a new name, mode 0600), so that no
        # caller truncates a draft another is about to link.
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        draft = Path(name)
        with os.fdopen(fd, "w") as out:
            out.write(new_secret() + "\n")
        try:
            os.link(draft, path)  # fails if another process was first: its secret is kept
            made = True
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                draft.unlink()
    secret = path.read_text().strip()
    if webhook_key(secret) is None:
        raise ValueError(f"the webhook secret in {path} {WEAK_SECRET}")
    return secret, made


def with_secret(settings: Settings) -> Settings:
    """`settings` with `webhook_secret` set: as given, or the one kept in
    `webhook_secret_file` (made at the first start), saying so in the log with where to read
    it. Raises: `ValueError`, `OSError` (`kept_secret`)."""
    if settings.webhook_secret is not None:
        return settings
    path = settings.webhook_secret_file
    secret, made = kept_secret(path)
    if made:
        log.warning(
            "JOBQ_WEBHOOK_SECRET is unset: made a webhook signing secret and kept it in %s;"
            " receivers verify deliveries with it (read it there)",
            path,
        )
    else:
        log.info("webhook deliveries are signed with the secret kept in %s", path)
    return settings.model_copy(update={"webhook_secret": SecretStr(secret)})
