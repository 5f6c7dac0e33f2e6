"""`send_reminder`: deliver a reminder to its user's webhook (or to the log)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging

import httpx
from pydantic import BaseModel

from jobq.config import Settings
from jobq.db import transaction
from jobq.domain import reminders
from jobq.errors import JobqError
from jobq.queue import JobContext, handler

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Jobq-Signature"


class SendReminderArgs(BaseModel):
    """Arguments of `send_reminder`."""

    reminder_id: int


class WebhookFailed(JobqError):
    """The webhook did not accept the delivery."""

    code = "webhook_failed"


def sign(body: bytes, secret: str) -> str:
    """Return the `X-Jobq-Signature` value of `body`: `sha256=` and the hex HMAC-SHA256 of the
    exact body bytes under `secret` (the scheme GitHub webhooks use)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@handler(reminders.SEND_REMINDER, args=SendReminderArgs, timeout=60)
async def send_reminder(args: SendReminderArgs, job: JobContext) -> None:
    """POST the reminder as JSON (`reminder_id`, `user_id`, `message`, `remind_at`, `attempt`)
    to the user's webhook, signed; then mark it sent (once, even if this job runs twice).
    Raises: `WebhookFailed` on a non-2xx answer, `httpx.HTTPError` on network errors: the
    attempt fails and is retried with backoff."""
    settings: Settings = job.state["settings"]
    http: httpx.AsyncClient = job.state["http"]
    async with transaction(readonly=True):
        delivery = await reminders.pending_delivery(args.reminder_id)
    if delivery is None:
        return  # sent by an earlier run, or deleted
    if delivery.webhook_url is None:
        log.info(
            "reminder %s for user %s: %s", delivery.reminder_id, delivery.user_id, delivery.message
        )
    else:
        body = json.dumps(
            {
                "reminder_id": delivery.reminder_id,
                "user_id": delivery.user_id,
                "message": delivery.message,
                "remind_at": delivery.remind_at.isoformat(),
                "attempt": job.attempt,
            },
            ensure_ascii=False,
        ).encode()
        secret = settings.webhook_secret.get_secret_value()
        response = await http.post(
            delivery.webhook_url,
            content=body,
            headers={"Content-Type": "application/json", SIGNATURE_HEADER: sign(body, secret)},
        )
        if not response.is_success:
            raise WebhookFailed(f"webhook answered HTTP {response.status_code}")
    async with transaction():
        await reminders.mark_sent(args.reminder_id, attempts=job.attempt)
