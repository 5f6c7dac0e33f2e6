"""Property-based fuzzing of the HTTP API from its own OpenAPI document (schemathesis).

The app is served by hypercorn on 127.0.0.1 over a real, seeded database (users, reminders,
exports, dead jobs, a live worker). For every operation of `/openapi.json`, schemathesis
generates requests that fit the document (positive) and requests that break it (negative);
positive ones also reuse the seeded ids, so that paths reach real rows. Admin requests carry
the admin token, and user-scoped requests the API key of the seeded user who owns the ids in
their path (else the first user's: another user's key, so a 404), or (sometimes) whatever
schemathesis generated (none, or a wrong one: a 401). Every response must pass:

- `not_a_server_error`: no 5xx;
- `status_code_conformance`, `content_type_conformance`, `response_headers_conformance`,
  `response_schema_conformance`: the status, media type, headers and body are documented;
- `negative_data_rejection`: a request that breaks the document gets a 4xx.

A long-poll's `wait` (up to 60 s, on `GET /jobs/<id>` and `GET /exports/<id>`) that fits the
document is cut to `WAIT_S`: a seeded reminder's job stays queued for an hour, and a wait on it
would hold the example for the whole `wait` (beyond the client's timeout; hypothesis then
shrinks that "failure" with more such waits). Waits that break the document are sent as
generated. `tests/api` tests what a long wait answers.

`JOBQ_FUZZ_EXAMPLES` (default 150) bounds the examples per operation and mode. One JSON line
summarises the run; it is printed and appended to `.chaos/results.jsonl`.
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from jobq import db
from jobq.app import create_app
from jobq.db import Connection, Database
from jobq.domain import exports, reminders
from jobq.queue import Job, Registry, Worker, enqueue
from tests.api.conftest import ADMIN_TOKEN
from tests.chaos.helpers import emit
from tests.conftest import make_settings
from tests.toolkit.served import served

pytestmark = pytest.mark.chaos

EXAMPLES = int(os.environ.get("JOBQ_FUZZ_EXAMPLES", "150"))
"""Examples per operation and generation mode."""
WAIT_S = 0.2
"""The longest long-poll `wait` sent (seconds): a longer one that fits the document is cut to it."""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]


@dataclass
class Tally:
    """What the run did: examples sent, their statuses, and the failures found."""

    operations: int = 0
    examples: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[dict[str, str]] = field(default_factory=list)
    nothing_to_negate: list[str] = field(default_factory=list)


@pytest.fixture
async def base_url(database: Database) -> AsyncIterator[str]:
    """The app (admin token set, no in-process worker) served by hypercorn on 127.0.0.1."""
    app = create_app(make_settings(database.dsn, admin_token=ADMIN_TOKEN))
    try:
        async with served(app) as url:
            yield url
    finally:
        db.bind(database)


@dataclass
class Seeded:
    """The seeded rows' ids by path parameter, and the API key owning each `(name, id)`."""

    ids: dict[str, list[int]]
    keys: dict[tuple[str, int], str]
    first_key: str

    def key_for(self, path_parameters: dict[str, Any]) -> str:
        """The key of the user who owns the first seeded id of the path, else the first's."""
        for name, value in path_parameters.items():
            if isinstance(value, int) and (name, value) in self.keys:
                return self.keys[(name, value)]
        return self.first_key


async def seed(base_url: str, worker: Worker, conn: Connection) -> Seeded:
    """Users (with a spare key each), reminders, exports and dead jobs to aim at."""
    ids: dict[str, list[int]] = {
        "user_id": [],
        "key_id": [],
        "reminder_id": [],
        "export_id": [],
        "job_id": [],
    }
    keys: dict[tuple[str, int], str] = {}
    key = ""

    def post(path: str, body: Any = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = requests.post(base_url + path, json=body, timeout=10, headers=headers)
        assert response.status_code in (201, 202), response.text
        created: dict[str, Any] = response.json()
        return created

    for n in range(3):
        key = ""
        user = await asyncio.to_thread(
            post, "/users", {"name": f"User {n}", "email": f"user{n}@example.com"}
        )
        key = user["api_key"]
        spare = await asyncio.to_thread(post, f"/users/{user['id']}/keys")  # fuzz may revoke it
        reminder = await asyncio.to_thread(
            post, f"/users/{user['id']}/reminders", {"message": "hi", "remind_in_seconds": 3600}
        )
        export = await asyncio.to_thread(post, f"/users/{user['id']}/exports")
        for name, value in [
            ("user_id", user["id"]),
            ("key_id", spare["id"]),
            ("reminder_id", reminder["id"]),
            ("export_id", export["id"]),
        ]:
            ids[name].append(value)
            keys[(name, value)] = key
    for n in range(5):
        await enqueue(Job(job_type="fuzz.nobody", arguments={"n": n}))
    # the worker has no handlers: the exports' jobs and these five are buried at once
    assert await worker.run_once() == 8
    await worker.wait_idle()
    ids["job_id"] = [r["id"] for r in await conn.fetch("SELECT id FROM job_dead ORDER BY id")]
    assert len(ids["job_id"]) == 8
    first = keys[("user_id", ids["user_id"][0])]
    return Seeded(ids, keys, first)


def describe(exc: BaseException) -> str:
    """The failure as schemathesis and hypothesis report it (checks, falsifying example, a
    curl command to reproduce), without the traceback."""
    parts = traceback.format_exception_only(exc)
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            parts += traceback.format_exception_only(inner)
    return "".join(parts)[-6000:]


def examples(
    operation: APIOperation[Any, Any, Any, Any],
    mode: GenerationMode,
    strategy: st.SearchStrategy[Case[Any]],
    *,
    base_url: str,
    session: requests.Session,
    tally: Tally,
    seeded: Seeded,
) -> Callable[[], None]:
    """The hypothesis test of one operation in one mode: send each case, check the answer."""
    schemes = {
        name for requirement in operation.definition.raw.get("security", []) for name in requirement
    }

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
    )
    @given(case=strategy, token=st.booleans())
    def run(case: Case[Any], token: bool) -> None:
        if token and "admin_token" in schemes:  # else: what schemathesis generated
            case.headers["Authorization"] = f"Bearer {ADMIN_TOKEN}"
        elif token and "api_key" in schemes:
            key = seeded.key_for(dict(case.path_parameters or {}))
            case.headers["Authorization"] = f"Bearer {key}"
        wait = (case.query or {}).get("wait")
        if isinstance(wait, int | float) and not isinstance(wait, bool) and WAIT_S < wait <= 60:
            case.query["wait"] = WAIT_S  # fits the document still; see the module's docstring
        response = case.call(base_url=base_url, session=session, timeout=30)
        tally.examples += 1
        tally.statuses[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)

    return run


def fuzz(base_url: str, seeded: Seeded) -> Tally:
    """Run every operation of the document in both modes; return the tally."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    tally = Tally()
    session = requests.Session()
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result
        operation = result.ok()
        tally.operations += 1
        inputs = [operation.path_parameters, operation.query, operation.headers, operation.body]
        modes = [GenerationMode.POSITIVE]
        if operation.definition.raw.get("security") or any(len(i) for i in inputs):
            modes.append(GenerationMode.NEGATIVE)
        else:
            tally.nothing_to_negate.append(operation.label)  # no parameter, no body
        for mode in modes:
            strategies = [operation.as_strategy(generation_mode=mode)]
            if mode is GenerationMode.POSITIVE:  # aim at the seeded rows too
                for parameter in operation.path_parameters:
                    strategies += [
                        operation.as_strategy(
                            generation_mode=mode, path_parameters={parameter.name: value}
                        )
                        for value in seeded.ids.get(parameter.name, [])
                    ]
            run = examples(
                operation,
                mode,
                st.one_of(strategies),
                base_url=base_url,
                session=session,
                tally=tally,
                seeded=seeded,
            )
            try:
                run()
            except (Exception, BaseExceptionGroup) as exc:  # schemathesis's FailureGroup too
                tally.failures.append(
                    {"operation": operation.label, "mode": mode.value, "error": describe(exc)}
                )
    return tally


@pytest.mark.timeout(300)  # about 40 s on an idle 2-core machine; headroom for a busy one
async def test_fuzz_the_api_from_its_openapi_document(
    base_url: str, make_worker: Any, conn: Connection
) -> None:
    handlers = Registry()  # no handlers; the application's queues, so exports are claimed
    for name in (exports.QUEUE, reminders.QUEUE):
        handlers.queue(name)
    worker = await make_worker(handlers)
    seeded = await seed(base_url, worker, conn)
    started = time.monotonic()
    tally = await asyncio.to_thread(fuzz, base_url, seeded)
    seconds = round(time.monotonic() - started, 1)
    summary = {
        "scenario": "fuzz",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "examples": tally.examples,
        "failures": len(tally.failures),
        "examples_per_operation_and_mode": EXAMPLES,
        "seconds": seconds,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "operations": tally.operations,
        "without_negative_cases": tally.nothing_to_negate,
    }
    emit(summary)
    for failure in tally.failures:
        print(f"\n--- {failure['operation']} ({failure['mode']}) ---\n{failure['error']}")
    assert tally.failures == []
    assert tally.examples >= EXAMPLES  # it did run
