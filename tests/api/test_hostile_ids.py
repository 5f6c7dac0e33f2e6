"""Ids and names from the path, the query and forms: ASCII digits within `bigint` only, and queue
names as declared. Every other spelling (another script's digits, superscripts, a NUL, a number
past the range) is a 4xx with the JSON error body, never a 500 or a row it happens to name."""

from __future__ import annotations

from typing import Any

import pytest
from quart.typing import TestClientProtocol as Client

from jobq.config import Settings
from jobq.db import Connection
from jobq.domain.types import BIGINT_MAX, parse_id
from tests.api.conftest import ADMIN, ADMIN_TOKEN
from tests.api.helpers import act_as, assert_error, create_reminder, create_user
from tests.conftest import make_settings


@pytest.fixture
def settings(database_url: str) -> Settings:
    return make_settings(database_url, admin_token=ADMIN_TOKEN)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", 1),
        ("0042", 42),
        (str(BIGINT_MAX), BIGINT_MAX),
        (str(BIGINT_MAX + 1), None),
        ("99999999999999999999", None),
        ("0", None),
        ("", None),
        ("-1", None),
        ("+1", None),
        (" 1", None),
        ("1\n", None),
        ("²", None),
        ("\u0661", None),  # ARABIC-INDIC DIGIT ONE
        ("\uff11", None),  # FULLWIDTH DIGIT ONE
    ],
)
def test_parse_id_takes_ascii_digits_in_range_only(text: str, expected: int | None) -> None:
    assert parse_id(text) == expected


async def test_other_scripts_digits_name_no_reminder(client: Client) -> None:
    ann = await create_user(client)
    reminder = await create_reminder(client, ann["id"], message="hi", remind_in_seconds=60)
    assert reminder["id"] == 1
    assert (await client.get("/reminders/1")).status_code == 200
    for spelling in ("\u0661", "\u06f1", "\uff11", "¹", "1\u200b"):
        response = await client.get(f"/reminders/{spelling}")
        assert response.status_code == 404, spelling
        assert_error(await response.get_json(), "not_found")
        deleted = await client.delete(f"/reminders/{spelling}")
        assert deleted.status_code == 404, spelling
    assert (await client.get("/reminders/1")).status_code == 200  # still there


async def test_api_key_whose_id_is_past_bigint_is_401(client: Client, conn: Connection) -> None:
    ann = await create_user(client)
    act_as(client, None)
    secret = ann["api_key"].rsplit("_", 1)[1]
    for key_id in ("9999999999999999999", str(BIGINT_MAX + 1)):
        response = await client.get(
            f"/users/{ann['id']}", headers={"Authorization": f"Bearer jq_{key_id}_{secret}"}
        )
        assert response.status_code == 401
        assert_error(await response.get_json(), "unauthorized")


@pytest.mark.parametrize("path", ["/dashboard/jobs/²", "/dashboard/jobs/\u0661", "/jobs/²"])
async def test_dashboard_and_admin_pages_refuse_non_ascii_ids(client: Client, path: str) -> None:
    response = await client.get(path, headers=ADMIN)
    assert response.status_code == 404
    assert_error(await response.get_json(), "not_found")


@pytest.mark.parametrize(
    ("name", "value"),
    [("id", "²"), ("id", "\u0661"), ("id", "99999999999999999999"), ("id", "-3"), ("after", "²")],
)
async def test_dashboard_job_search_refuses_malformed_ids(
    client: Client, name: str, value: str
) -> None:
    response = await client.get("/dashboard/jobs", query_string={name: value}, headers=ADMIN)
    assert response.status_code == 400


async def test_dashboard_dead_letter_refuses_malformed_ids(client: Client) -> None:
    page = await client.get("/dashboard/dead", query_string={"after": "²"}, headers=ADMIN)
    assert page.status_code == 200  # no such page: the first one
    for ids in (["²"], ["1", "\u0661"], ["99999999999999999999"]):
        form: dict[str, Any] = {"action": "retry", "id": ids}
        response = await client.post("/dashboard/dead", form=form, headers=ADMIN)
        assert response.status_code == 409, ids
        assert_error(await response.get_json(), "conflict")


@pytest.mark.parametrize("name", ["x%00", "x%00y", "X", "x%0a", "a" * 64, "%E2%80%AE"])
async def test_queue_names_outside_the_pattern_are_404(client: Client, name: str) -> None:
    for path in (f"/queues/{name}/pause", f"/dashboard/queues/{name}/pause"):
        response = await client.post(path, headers=ADMIN)
        assert response.status_code == 404, path
        assert_error(await response.get_json(), "not_found")
    assert (await client.post("/queues/default/pause", headers=ADMIN)).status_code == 204
