"""`send_reminder`: deliver a reminder to its user's webhook (or to the log)."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from datetime import UTC, datetime

import httpx
from pydantic import AwareDatetime, BaseModel, TypeAdapter

from jobq.config import Settings
from jobq.db import transaction
from jobq.domain import reminders
from jobq.errors import JobqError
from jobq.queue import JobContext, handler

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Jobq-Signature"


class SendReminderArgs(BaseModel):
    """Arguments of `send_reminder`: the reminder, and for a recurring one the occurrence's
    time (set by its schedule)."""

    reminder_id: int
    occurrence_at: AwareDatetime | None = None


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


def utc_z(moment: datetime) -> str:
    """`moment` in UTC as ISO 8601 with `Z`, the API's one time format: pydantic's JSON form
    (`2030-01-01T08:00:00Z`, microseconds when there are some)."""
    text: str = TypeAdapter(AwareDatetime).dump_python(moment.astimezone(UTC), mode="json")
    return text


def describe_failure(url: str, exc: httpx.HTTPError) -> str:
    """What failed, for the log and `last_error`: the error's type, the webhook's host, and the
    cause (`ReadError from hooks.example.com: connection reset by peer`). Never the URL's path,
    query or credentials."""
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    detail = next((str(e) for e in chain if str(e)), type(chain[-1]).__name__)
    if isinstance(exc, httpx.TimeoutException):
        detail = "timed out"  # the type says which timeout; the causes say nothing more
    return f"{type(exc).__name__} from {httpx.URL(url).host}: {detail}"


@handler(reminders.SEND_REMINDER, args=SendReminderArgs, queue=reminders.QUEUE, timeout=60)
async def send_reminder(args: SendReminderArgs, job: JobContext) -> None:
    """POST the reminder as JSON (`reminder_id`, `user_id`, `message`, `remind_at`, `attempt`;
    for an occurrence of a recurring one also `occurrence_at`, which a receiver can deduplicate
    on) to the user's webhook, signed (see `post_webhook`); then mark it sent, or the
    occurrence delivered (once, even if this job runs twice). The answer's status decides: an
    answer longer than `webhook_max_response_bytes` is not read further, and counts by its
    status alone.
    Raises: `WebhookFailed` on a non-2xx answer (a redirect included), on network errors and
    timeouts, and on an address the SSRF guard refuses (`jobq.domain.webhooks`), saying what
    failed: the attempt fails and is retried with backoff."""
    settings: Settings = job.state["settings"]
    http: httpx.AsyncClient = job.state["http"]
    occurrence = args.occurrence_at
    async with transaction(readonly=True):
        delivery = await reminders.pending_delivery(
            args.reminder_id, recurring=occurrence is not None
        )
    if delivery is None:
        return  # sent by an earlier run, or deleted
    if delivery.webhook_url is None:
        log.info(
            "reminder %s for user %s: %s", delivery.reminder_id, delivery.user_id, delivery.message
        )
    else:
        fields = {
            "reminder_id": delivery.reminder_id,
            "user_id": delivery.user_id,
            "message": delivery.message,
            "remind_at": utc_z(delivery.remind_at),
            "attempt": job.attempt,
        }
        if occurrence is not None:
            fields["occurrence_at"] = utc_z(occurrence)
        body = json.dumps(fields, ensure_ascii=False).encode()
        try:
            status, read_all = await post_webhook(
                http, delivery.webhook_url, body, settings=settings
            )
        except httpx.HTTPError as exc:
            raise WebhookFailed(describe_failure(delivery.webhook_url, exc)) from exc
        if not read_all:
            log.warning(
                "reminder %s: the webhook's answer is over %d bytes; the rest was not read",
                delivery.reminder_id,
                settings.webhook_max_response_bytes,
            )
        if not 200 <= status < 300:
            host = httpx.URL(delivery.webhook_url).host
            raise WebhookFailed(f"webhook at {host} answered HTTP {status}")
    async with transaction():
        if occurrence is None:
            await reminders.mark_sent(args.reminder_id, attempts=job.attempt)
        else:
            await reminders.mark_occurrence_sent(args.reminder_id, occurrence)
