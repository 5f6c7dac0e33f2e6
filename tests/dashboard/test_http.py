"""The dashboard over HTTP (hypercorn, httpx): who may look and act (the admin token, the
session cookie, CSRF), that nothing secret shows, and what the pages say. The browser's part is
`test_browser`."""

from __future__ import annotations

import logging
from collections import deque
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from freezegun import freeze_time

from jobq.api.throttle import FAILURE_BURST
from jobq.app import create_app
from jobq.config import Settings
from jobq.dashboard import lists, views
from jobq.dashboard.session import SESSION_MAX_AGE
from jobq.db import Connection
from jobq.queue import schedule
from jobq.queue.history import RATE_WINDOW_S, rates
from jobq.queue.recurrence import ScheduleSpec
from tests.conftest import make_settings
from tests.dashboard.conftest import ADMIN, ADMIN_TOKEN, MakeWorker, fill, fill_history, log_in
from tests.toolkit.served import served

PAGES = ("/dashboard/", "/dashboard/jobs", "/dashboard/dead", "/dashboard/jobs/1")


async def paused(conn: Connection, name: str = "default") -> bool:
    value: bool = await conn.fetchval("SELECT paused FROM job_queue WHERE name = $1", name)
    return value


# -- who may look --------------------------------------------------------------------------------


@pytest.fixture
def no_token_settings(pool_url: str) -> Settings:
    return make_settings(pool_url)


@pytest.mark.parametrize("path", [*PAGES, "/dashboard/login"])
async def test_without_an_admin_token_the_dashboard_is_404(
    path: str, pool_url: str, database: object
) -> None:
    async with (
        served(create_app(make_settings(pool_url))) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        response = await client.get(path)
        login = await client.post("/dashboard/login", data={"token": "x" * 20})
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
    assert login.status_code == 404


@pytest.mark.parametrize("path", PAGES)
async def test_a_page_without_a_session_sends_a_browser_to_the_login_form(
    http: httpx.AsyncClient, path: str
) -> None:
    response = await http.get(path)
    assert response.status_code == 303
    assert response.headers["location"].startswith("/dashboard/login?next=")


async def test_a_wrong_token_is_refused_and_sets_no_cookie(http: httpx.AsyncClient) -> None:
    response = await http.post("/dashboard/login", data={"token": "wrong-token-0123456789"})
    assert response.status_code == 401
    assert "set-cookie" not in response.headers
    assert "That is not the token." in response.text


async def test_the_login_sets_a_strict_secure_httponly_cookie_without_the_token(
    http: httpx.AsyncClient,
) -> None:
    response = await http.post(
        "/dashboard/login", data={"token": ADMIN_TOKEN, "next": "/dashboard/dead"}
    )
    assert response.status_code == 303
    assert response.headers["location"] == "/dashboard/dead"
    cookie = response.headers["set-cookie"]
    attributes = {a.strip().split("=")[0].lower() for a in cookie.split(";")}
    assert {"httponly", "secure", "samesite", "path"} <= attributes
    assert "SameSite=Strict" in cookie
    assert ADMIN_TOKEN not in cookie


async def test_the_login_never_sends_anyone_to_another_site(http: httpx.AsyncClient) -> None:
    for target in ("https://evil.example/", "//evil.example/", "/dashboard//evil.example"):
        response = await http.post("/dashboard/login", data={"token": ADMIN_TOKEN, "next": target})
        assert response.headers["location"] == "/dashboard/"


async def test_a_forged_or_foreign_session_cookie_is_no_session(http: httpx.AsyncClient) -> None:
    cookie, _ = await log_in(http)
    issued, nonce, signature = cookie.split(".")
    for forged in (
        f"{issued}.{nonce}.{'0' * len(signature)}",
        f"{int(issued) + 1}.{nonce}.{signature}",
        "x",
    ):
        response = await http.get("/dashboard/", headers={"Cookie": f"jobq_dashboard={forged}"})
        assert response.status_code == 303


async def test_a_session_ends_after_twelve_hours(http: httpx.AsyncClient) -> None:
    cookie, _ = await log_in(http)
    jar = {"Cookie": f"jobq_dashboard={cookie}"}
    with freeze_time(datetime.now(UTC) + SESSION_MAX_AGE - timedelta(minutes=1), real_asyncio=True):
        assert (await http.get("/dashboard/", headers=jar)).status_code == 200
    with freeze_time(datetime.now(UTC) + SESSION_MAX_AGE + timedelta(minutes=1), real_asyncio=True):
        assert (await http.get("/dashboard/", headers=jar)).status_code == 303


async def test_a_bearer_token_opens_the_pages_and_actions_without_csrf(
    http: httpx.AsyncClient, conn: Connection
) -> None:
    for path in PAGES[:3]:
        assert (await http.get(path, headers=ADMIN)).status_code == 200
    wrong = {"Authorization": "Bearer wrong-token-0123456789"}
    assert (await http.get("/dashboard/", headers=wrong)).status_code == 401
    response = await http.post("/dashboard/queues/default/pause", headers=ADMIN)
    assert response.status_code == 303
    assert await paused(conn)


# -- cross-site requests -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("form", "headers"),
    [
        ({}, {}),
        ({"csrf": "0" * 64}, {}),
        ({"csrf": "{csrf}"}, {"Origin": "https://evil.example"}),
        ({"csrf": "{csrf}"}, {"Origin": "null"}),
        ({"csrf": "{csrf}"}, {"Sec-Fetch-Site": "cross-site"}),
    ],
    ids=["no-csrf", "wrong-csrf", "foreign-origin", "null-origin", "cross-site-fetch"],
)
async def test_a_cross_site_action_is_refused_and_changes_nothing(
    http: httpx.AsyncClient,
    conn: Connection,
    form: dict[str, str],
    headers: dict[str, str],
) -> None:
    cookie, csrf = await log_in(http)
    data = {k: v.format(csrf=csrf) for k, v in form.items()}
    for path in ("/dashboard/queues/default/pause", "/dashboard/logout"):
        response = await http.post(
            path, data=data, headers={"Cookie": f"jobq_dashboard={cookie}", **headers}
        )
        assert response.status_code == 403
        assert response.json()["error"] == "csrf_failed"
    assert not await paused(conn)


async def test_an_action_without_a_session_is_401_and_changes_nothing(
    http: httpx.AsyncClient, conn: Connection
) -> None:
    response = await http.post("/dashboard/queues/default/pause", data={"csrf": "0" * 64})
    assert response.status_code == 401
    assert response.json()["error"] == "unauthorized"
    assert not await paused(conn)


async def test_a_same_site_action_with_its_csrf_token_works_and_logout_ends_the_session(
    http: httpx.AsyncClient, conn: Connection, base_url: str
) -> None:
    cookie, csrf = await log_in(http)
    jar = {"Cookie": f"jobq_dashboard={cookie}", "Origin": base_url}
    response = await http.post("/dashboard/queues/default/pause", data={"csrf": csrf}, headers=jar)
    assert response.status_code == 303
    assert await paused(conn)
    out = await http.post("/dashboard/logout", data={"csrf": csrf}, headers=jar)
    assert out.status_code == 303
    assert (
        'jobq_dashboard=""' in out.headers["set-cookie"] or "Max-Age=0" in out.headers["set-cookie"]
    )


async def test_after_logout_the_old_cookie_and_form_token_are_refused_by_every_process(
    http: httpx.AsyncClient, conn: Connection, settings: Settings, base_url: str
) -> None:
    """The session ends on the server: a second web process (another app, its own pool) that
    never saw the logout refuses the cookie as well."""
    cookie, csrf = await log_in(http)
    jar = {"Cookie": f"jobq_dashboard={cookie}", "Origin": base_url}
    async with (
        served(create_app(settings)) as other_url,
        httpx.AsyncClient(base_url=other_url, timeout=10) as other,
    ):
        assert (await other.get("/dashboard/", headers=jar)).status_code == 200
        out = await http.post("/dashboard/logout", data={"csrf": csrf}, headers=jar)
        assert out.status_code == 303
        for client in (http, other):
            page = await client.get("/dashboard/", headers=jar)
            assert page.status_code == 303  # to the login form
            assert page.headers["location"].startswith("/dashboard/login")
            action = await client.post(
                "/dashboard/queues/default/pause", data={"csrf": csrf}, headers=jar
            )
            assert action.status_code == 401
            assert action.json()["error"] == "unauthorized"
    assert not await paused(conn)
    assert await conn.fetchval("SELECT count(*) FROM dashboard_session") == 0
    again, _ = await log_in(http)  # a new login works
    assert again != cookie


async def test_wrong_tokens_at_the_login_form_are_throttled_per_address(
    pool_url: str, database: object
) -> None:
    settings = make_settings(pool_url, admin_token=ADMIN_TOKEN, auth_failures_per_min=1)
    async with (
        served(create_app(settings)) as url,
        httpx.AsyncClient(base_url=url, timeout=10) as client,
    ):
        for _ in range(FAILURE_BURST):
            wrong = await client.post("/dashboard/login", data={"token": "wrong-token-0123456789"})
            assert wrong.status_code == 401
        for token in ("wrong-token-0123456789", ADMIN_TOKEN):  # the right one waits too
            throttled = await client.post("/dashboard/login", data={"token": token})
            assert throttled.status_code == 429
            assert int(throttled.headers["Retry-After"]) >= 1
            assert "set-cookie" not in throttled.headers
            assert "try again in" in throttled.text
        bearer = await client.get("/dashboard/", headers=ADMIN)
        assert bearer.status_code == 429
        assert bearer.json()["error"] == "too_many_requests"


async def test_no_secret_shows_in_a_page_or_a_log(
    http: httpx.AsyncClient, make_worker: MakeWorker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    await fill(make_worker)
    await http.post("/dashboard/login", data={"token": "wrong-token-0123456789"})
    cookie, csrf = await log_in(http)
    jar = {"Cookie": f"jobq_dashboard={cookie}"}
    pages = [(await http.get(p, headers=jar)).text for p in PAGES]
    await http.post("/dashboard/queues/mail/pause", data={"csrf": csrf}, headers=jar)
    logged = "\n".join(  # all but the test client's own traces
        r.getMessage() for r in caplog.records if not r.name.startswith("httpcore")
    )
    for text in [*pages, logged]:
        assert ADMIN_TOKEN not in text
        assert cookie not in text
        assert "wrong-token-0123456789" not in text
    assert "action=queue.pause target=queue:mail" in logged  # the audit line


async def test_pages_carry_a_content_security_policy_and_no_inline_script(
    http: httpx.AsyncClient,
) -> None:
    cookie, _ = await log_in(http)
    response = await http.get("/dashboard/", headers={"Cookie": f"jobq_dashboard={cookie}"})
    assert "script-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert "<script>" not in response.text
    assert 'style="' not in response.text


# -- what the pages say --------------------------------------------------------------------------


async def test_the_overview_shows_queues_workers_schedules_and_the_database(
    http: httpx.AsyncClient, make_worker: MakeWorker, conn: Connection
) -> None:
    ids = await fill(make_worker)
    now = datetime.now(UTC)
    await schedule.declare(
        conn,
        [ScheduleSpec(name="nightly-report", job_type="report.build", cron="0 3 * * *")],
        now=now,
    )
    page = (await http.get("/dashboard/", headers=ADMIN)).text
    for text in ("mail", "reports", "imports", "4 at once", "alive", "nightly-report", "0 3 * * *"):
        assert text in page
    assert page.count("<time") >= 3  # the worker's times, the schedule's next occurrences
    for text in ("job_done", "dead rows", "Oldest open transaction"):
        assert text in page
    assert f">{len(ids['queued'])}<" in page  # the queued imports
    assert "jobs/s" in page


async def test_empty_sections_say_so(http: httpx.AsyncClient) -> None:
    overview = (await http.get("/dashboard/", headers=ADMIN)).text
    assert "No workers registered" in overview
    assert "No schedules." in overview
    assert "No dead jobs." in (await http.get("/dashboard/dead", headers=ADMIN)).text
    missing = await http.get("/dashboard/jobs/999", headers=ADMIN)
    assert missing.status_code == 404
    assert "No job 999" in missing.text


async def test_a_bad_search_is_400_with_the_reason(http: httpx.AsyncClient) -> None:
    for query in ("state=lost", "queue=NOT%20A%20NAME", "id=12x"):
        response = await http.get(f"/dashboard/jobs?{query}", headers=ADMIN)
        assert response.status_code == 400
        assert 'class="error"' in response.text


async def test_the_search_filters_by_queue_type_and_state(
    http: httpx.AsyncClient, make_worker: MakeWorker
) -> None:
    ids = await fill(make_worker, num_dead=2)
    failed = (await http.get("/dashboard/jobs?state=failed&queue=mail", headers=ADMIN)).text
    assert all(f">{i}</a>" in failed for i in ids["dead"])
    assert f">{ids['succeeded'][0]}</a>" not in failed
    by_id = await http.get(f"/dashboard/jobs?id={ids['succeeded'][0]}", headers=ADMIN)
    assert by_id.headers["location"] == f"/dashboard/jobs/{ids['succeeded'][0]}"


def test_rates_are_the_change_of_the_counts_over_the_last_minute() -> None:
    readings: deque[tuple[float, dict[str, dict[str, int]]]] = deque()
    assert rates(readings, 100.0, {"mail": {"enqueued": 10}}) == {}
    assert rates(readings, 100.5, {"mail": {"enqueued": 11}}) == {}  # too soon
    found = rates(readings, 102.0, {"mail": {"enqueued": 30, "succeeded": 4}})
    assert found == {"mail": {"enqueued": 10.0, "succeeded": 2.0, "failed": 0.0}}
    later = 100.0 + RATE_WINDOW_S + 1  # the first reading is forgotten
    assert rates(readings, later, {"mail": {"enqueued": 30 + 2 * 59}})["mail"]["enqueued"] == (
        2 * 59 / (later - 102.0)
    )
    assert timedelta(seconds=RATE_WINDOW_S) == timedelta(minutes=1)


async def test_a_search_that_takes_too_long_is_stopped_and_says_so(
    http: httpx.AsyncClient, conn: Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lists, "SEARCH_TIMEOUT_MS", 200)
    async with conn.transaction():
        await conn.execute("LOCK TABLE job_done IN ACCESS EXCLUSIVE MODE")  # the search waits
        response = await http.get("/dashboard/jobs?job_type=rare", headers=ADMIN)
    assert response.status_code == 503
    assert "took longer than 0.2 s" in response.text
    assert (await http.get("/dashboard/jobs?job_type=rare", headers=ADMIN)).status_code == 200


async def test_rates_come_from_the_job_counter_table(
    http: httpx.AsyncClient, conn: Connection
) -> None:
    """The metrics' cumulative counts (`job_counter`): the overview shows their change per
    second between two readings."""
    await conn.execute("DELETE FROM job_counter")
    add = "INSERT INTO job_counter (queue, job_type, event, count) VALUES ($1, 't', $2, $3)"
    t0 = datetime.now(UTC)
    with freeze_time(t0, real_asyncio=True):
        first = (await http.get("/dashboard/", headers=ADMIN)).text
    await conn.execute(add, "default", "enqueued", 1500)
    await conn.execute(add, "default", "succeeded", 30)
    with freeze_time(t0 + timedelta(seconds=10), real_asyncio=True):
        second = (await http.get("/dashboard/", headers=ADMIN)).text
    assert 'data-label="enqueued (jobs/s)">\u2013<' in first  # a dash: no reading before
    assert 'data-label="enqueued (jobs/s)">150<' in second
    assert 'data-label="succeeded (jobs/s)">3<' in second


async def test_a_deep_queue_is_counted_up_to_a_cap(
    http: httpx.AsyncClient, make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    await fill(make_worker, num_dead=0)  # 5 queued imports
    monkeypatch.setattr(views, "MAX_DEPTH", 3)
    page = (await http.get("/dashboard/", headers=ADMIN)).text
    assert 'data-label="ripe (jobs)"><span title="counted up to 3' in page
    assert "&gt; 3</span>" in page
    monkeypatch.setattr(views, "MAX_DEPTH", 5)
    page = (await http.get("/dashboard/", headers=ADMIN)).text
    assert 'data-label="ripe (jobs)">5<' in page


async def test_the_database_panel_lists_every_queue_table(
    http: httpx.AsyncClient, conn: Connection
) -> None:
    """Plain tables (`job`, `job_running`, `job_dead`) and partitioned ones (`job_done`,
    `job_attempt`, their partitions summed) alike, each with its size."""
    await conn.execute("ANALYZE job, job_running, job_dead, job_done, job_attempt")
    page = (await http.get("/dashboard/", headers=ADMIN)).text
    panel = page[page.index('id="database"') :]
    for table in ("job", "job_attempt", "job_dead", "job_done", "job_running"):
        assert f'<th scope="row"><code>{table}</code></th>' in panel, table
    assert panel.count("KiB</td>") >= 5  # every table has indexes: a size of kibibytes


async def test_the_history_answers_json_for_a_known_window(
    http: httpx.AsyncClient, conn: Connection
) -> None:
    await fill_history(conn, ("mail",))
    hour = await http.get("/dashboard/history?window=1h", headers=ADMIN)
    assert hour.status_code == 200
    [mail] = hour.json()["queues"]
    assert len(mail["t"]) == 60
    assert set(mail) >= {"enqueued", "succeeded", "failed", "pickup_p95", "run_p50"}
    assert (await http.get("/dashboard/history?window=2h", headers=ADMIN)).status_code == 400
    assert (await http.get("/dashboard/history")).status_code == 303  # to the login form


@pytest.mark.parametrize("arguments", ["[1]", "{not json", "x" * 3000])
async def test_a_search_by_arguments_takes_a_json_object(
    http: httpx.AsyncClient, arguments: str
) -> None:
    response = await http.get("/dashboard/jobs", params={"arguments": arguments}, headers=ADMIN)
    assert response.status_code == 400
    assert "Not a valid search (arguments" in response.text
    dead = await http.get("/dashboard/dead", params={"arguments": arguments}, headers=ADMIN)
    assert dead.status_code == 400
