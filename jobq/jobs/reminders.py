"""`send_reminder`: deliver a reminder to its user's webhook (or to the log).

An attempt resolves the webhook's host and checks every address (the SSRF guard,
`jobq.domain.webhooks`), takes a hold on the address's share of deliveries
(`jobq.domain.shares`; snoozed when it is full), then POSTs the reminder signed by the Standard
Webhooks scheme (`jobq.domain.signing`) to the checked address, all within
`webhook_total_timeout`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from datetime import UTC, datetime

import aiohttp
from pydantic import AwareDatetime, BaseModel, TypeAdapter
from yarl import URL

from jobq import clock
from jobq.config import Settings
from jobq.db import transaction
from jobq.domain import deliveries, reminders, shares, signing, webhooks
from jobq.errors import JobqError, Snooze, UnsafeWebhook
from jobq.queue import JobContext, handler

log = logging.getLogger(__name__)


class SendReminderArgs(BaseModel):
    """Arguments of `send_reminder`: the reminder, and for a recurring one the occurrence's
    time (set by its schedule)."""

    reminder_id: int
    occurrence_at: AwareDatetime | None = None


class WebhookFailed(JobqError):
    """The webhook did not accept the delivery."""

    code = "webhook_failed"


def delivery_id(reminder_id: int, occurrence_at: datetime | None) -> str:
    """The `webhook-id` of a reminder's delivery (of one occurrence of a recurring one): the
    same on every attempt, so a receiver can drop a delivery it has seen."""
    if occurrence_at is None:
        return f"msg_reminder_{reminder_id}"
    return f"msg_reminder_{reminder_id}_{utc_z(occurrence_at)}"


async def post_webhook(
    http: aiohttp.ClientSession, url: str, body: bytes, *, settings: Settings, msg_id: str
) -> tuple[int, bool]:
    """POST `body` (JSON) to `url` with the Standard Webhooks headers of delivery `msg_id`
    (`jobq.domain.signing`, under `settings.webhook_secret`), within the client's timeouts
    (`jobq.domain.webhooks.webhook_timeout`), never following a redirect. Return the answer's
    status and whether its body was read in full.

    The answer's body is read raw (never decompressed) up to `webhook_max_response_bytes`,
    then the connection is dropped: a webhook cannot make the worker read, or hold, more.
    Raises: `aiohttp.ClientError` on network errors, `TimeoutError` on timeouts;
    `RuntimeError` when no secret is set (`jobq.domain.signing.with_secret` sets one).
    """
    if settings.webhook_secret is None:
        raise RuntimeError("no webhook secret: see jobq.domain.signing.with_secret")
    secret = settings.webhook_secret.get_secret_value()
    headers = {
        "Content-Type": "application/json",
        **signing.signature_headers(secret, msg_id, body, clock.now()),
    }
    limit = settings.webhook_max_response_bytes
    async with http.post(url, data=body, headers=headers, allow_redirects=False) as response:
        size = 0
        async for chunk in response.content.iter_any():
            size += len(chunk)
            if size > limit:
                response.close()  # the rest is never read: the connection goes
                return response.status, False
        return response.status, True


async def deliver(
    http: aiohttp.ClientSession, url: str, body: bytes, *, settings: Settings, msg_id: str
) -> int:
    """One delivery attempt of `body` to `url` within `webhook_total_timeout`: resolve and check
    the host (`jobq.domain.webhooks.resolve_target`), take a hold on its address's share
    (`jobq.domain.shares.take`), POST to the checked address (`post_webhook`). Return the
    hold's id once the webhook accepted it (the caller releases it); a failed attempt releases
    it.
    Raises: `Snooze` when the address is at its limits; `WebhookFailed` saying what failed
    (never the URL's path, query or credentials, nor an address)."""
    host = URL(url).host
    total = settings.webhook_total_timeout.total_seconds()
    hold: int | None = None
    try:
        async with asyncio.timeout(total) as deadline:
            target = await webhooks.resolve_target(url, settings)
            taken = await shares.take(target.share_key, clock.now(), settings)
            if not isinstance(taken, int):
                raise Snooze(taken.total_seconds())
            hold = taken
            with webhooks.pinned(target):
                status, read_all = await post_webhook(
                    http, url, body, settings=settings, msg_id=msg_id
                )
    except (TimeoutError, UnsafeWebhook, aiohttp.ClientError) as exc:
        if hold is not None:
            await release(hold)
        if isinstance(exc, TimeoutError) and deadline.expired():
            raise WebhookFailed(f"webhook at {host}: no answer within {total:g} s") from exc
        if isinstance(exc, UnsafeWebhook):
            raise WebhookFailed(f"webhook at {host} refused: {exc.message}") from exc
        raise WebhookFailed(describe_failure(url, exc)) from exc
    if not read_all:
        log.warning(
            "the answer of the webhook at %s is over %d bytes; the rest was not read",
            host,
            settings.webhook_max_response_bytes,
        )
    if not 200 <= status < 300:
        await release(hold)
        raise WebhookFailed(f"webhook at {host} answered HTTP {status}")
    return hold


async def release(hold: int) -> None:
    """End hold `hold` (`jobq.domain.shares.release`) in a transaction of its own."""
    async with transaction():
        await shares.release(hold)


_AWARE = TypeAdapter(AwareDatetime)


def utc_z(moment: datetime) -> str:
    """`moment` in UTC as ISO 8601 with `Z`, the API's one time format: pydantic's JSON form
    (`2030-01-01T08:00:00Z`, microseconds when there are some)."""
    text: str = _AWARE.dump_python(moment.astimezone(UTC), mode="json")
    return text


def describe_failure(url: str, exc: BaseException) -> str:
    """What failed, for the log and `last_error`: the error's type, the webhook's host, and the
    cause (`ClientOSError from hooks.example.com: Connection reset by peer`; a timeout says
    `timed out`, an error with an errno says its name). Never the URL's path, query or
    credentials, nor the address connected to."""
    parsed = URL(url)
    chain: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    errno = next((e.errno for e in chain if isinstance(e, OSError) and e.errno), None)
    if isinstance(exc, TimeoutError):
        detail = "timed out"  # the type says which timeout; the causes say nothing more
    elif errno is not None:
        detail = os.strerror(errno)  # the OSError's own text may name the address
    else:
        detail = next((str(e) for e in chain if str(e)), type(chain[-1]).__name__)
    for part in (url, parsed.raw_path_qs, parsed.path_qs, parsed.raw_user, parsed.raw_password):
        if part and len(part) > 1:
            detail = detail.replace(part, "...")
    return f"{type(exc).__name__} from {parsed.host}: {detail}"


@handler(reminders.SEND_REMINDER, args=SendReminderArgs, queue=reminders.QUEUE, timeout=60)
async def send_reminder(args: SendReminderArgs, job: JobContext) -> None:
    """POST the reminder as JSON (`reminder_id`, `user_id`, `message`, `remind_at`, `attempt`;
    for an occurrence of a recurring one also `occurrence_at`) to the user's webhook, signed
    (Standard Webhooks: `webhook-id` names the delivery, the same on every attempt), see
    `deliver`; then mark it sent, or the occurrence delivered (once, even if this job runs
    twice). The answer's status decides: an answer longer than `webhook_max_response_bytes` is
    not read further, and counts by its status alone.
    Raises: `Snooze` when the webhook's address is at its share of deliveries
    (`jobq.domain.shares`); `WebhookFailed` on a non-2xx answer (a redirect included), on
    network errors and timeouts (the whole attempt within `webhook_total_timeout`), and on an
    address the SSRF guard refuses (`jobq.domain.webhooks`, checked at every attempt), saying
    what failed: the attempt fails and is retried with backoff."""
    settings: Settings = job.state["settings"]
    http: aiohttp.ClientSession = job.state["http"]
    occurrence = args.occurrence_at
    delivery = await deliveries.pending_delivery(args.reminder_id, recurring=occurrence is not None)
    if delivery is None:
        return  # sent by an earlier run, or deleted
    hold: int | None = None
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
        msg_id = delivery_id(delivery.reminder_id, occurrence)
        hold = await deliver(http, delivery.webhook_url, body, settings=settings, msg_id=msg_id)
    if occurrence is None:
        await deliveries.mark_sent(args.reminder_id, attempts=job.attempt, hold_id=hold)
    else:
        await deliveries.mark_occurrence_sent(args.reminder_id, occurrence, hold_id=hold)
