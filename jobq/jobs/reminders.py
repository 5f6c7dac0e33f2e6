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


def webhook_timeout(settings: Settings) -> httpx.Timeout:
    """The limits of one webhook call: `webhook_connect_timeout` to connect (and to get a
    pooled connection), `webhook_timeout` for each read and write. The whole attempt is
    bounded by the handler's own timeout."""
    connect = settings.webhook_connect_timeout.total_seconds()
    read = settings.webhook_timeout.total_seconds()
    return httpx.Timeout(connect=connect, read=read, write=read, pool=connect)


async def post_webhook(
    http: httpx.AsyncClient, url: str, body: bytes, *, settings: Settings
) -> tuple[int, bool]:
    """POST `body` (JSON) to `url`, signed with `settings.webhook_secret`, within
    `webhook_timeout(settings)`, never following a redirect. Return the answer's status and
    whether its body was read in full.

    The answer's body is read raw (never decompressed) up to `webhook_max_response_bytes`,
    then the connection is dropped: a webhook cannot make the worker read, or hold, more.
    Raises: `httpx.HTTPError` on network errors and timeouts.
    """
    secret = settings.webhook_secret.get_secret_value()
    headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(body, secret)}
    limit = settings.webhook_max_response_bytes
    request = http.build_request(
        "POST", url, content=body, headers=headers, timeout=webhook_timeout(settings)
    )
    response = await http.send(request, stream=True, follow_redirects=False)
    try:
        size = 0
        async for chunk in response.aiter_raw():
            size += len(chunk)
            if size > limit:
                return response.status_code, False
        return response.status_code, True
    finally:
        await response.aclose()


@handler(reminders.SEND_REMINDER, args=SendReminderArgs, timeout=60)
async def send_reminder(args: SendReminderArgs, job: JobContext) -> None:
    """POST the reminder as JSON (`reminder_id`, `user_id`, `message`, `remind_at`, `attempt`)
    to the user's webhook, signed (see `post_webhook`); then mark it sent (once, even if this
    job runs twice). The answer's status decides: an answer longer than
    `webhook_max_response_bytes` is not read further, and counts by its status alone.
    Raises: `WebhookFailed` on a non-2xx answer (a redirect included), `httpx.HTTPError` on
    network errors and timeouts: the attempt fails and is retried with backoff."""
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
        status, read_all = await post_webhook(http, delivery.webhook_url, body, settings=settings)
        if not read_all:
            log.warning(
                "reminder %s: the webhook's answer is over %d bytes; the rest was not read",
                delivery.reminder_id,
                settings.webhook_max_response_bytes,
            )
        if not 200 <= status < 300:
            raise WebhookFailed(f"webhook answered HTTP {status}")
    async with transaction():
        await reminders.mark_sent(args.reminder_id, attempts=job.attempt)
