"""Per-user API keys: every user-scoped route needs its user's key (401 without or with a wrong
one, 404 with another user's); rotation, revocation; the key is never stored, logged or echoed;
sign-up open or admin-only; audit lines."""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pytest
from quart.typing import TestClientProtocol as Client

from jobq.app import create_app
from jobq.config import Settings
from jobq.db import Connection, Database
from tests.api.conftest import ADMIN, ADMIN_TOKEN
from tests.api.helpers import JSON, act_as, assert_error, bearer, create_reminder, create_user
from tests.conftest import make_settings
from tests.keyed_client import use_keyed_client

ROUTES = [
    ("GET", "/users/{user}"),
    ("POST", "/users/{user}/keys"),
    ("DELETE", "/users/{user}/keys/{key}"),
    ("POST", "/users/{user}/reminders"),
    ("GET", "/users/{user}/reminders"),
    ("POST", "/users/{user}/exports"),
    ("GET", "/reminders/{reminder}"),
    ("DELETE", "/reminders/{reminder}"),
    ("GET", "/exports/{export}"),
    ("GET", "/exports/{export}.ics"),
    ("DELETE", "/exports/{export}"),
]
"""Every user-scoped route."""

WRONG_KEYS = {
    "no header": None,
    "empty bearer": "Bearer ",
    "another scheme": "Basic YW5uOnB3",
    "malformed": "Bearer not-a-key",
    "unknown id": "Bearer jq_999_" + "a" * 43,
    "right id, wrong secret": None,  # filled in from Ann's key
}


async def call(client: Client, method: str, path: str, authorization: str | None) -> Any:
    headers = {} if authorization is None else {"Authorization": authorization}
    if method == "POST" and path.endswith("/reminders"):
        return await client.post(
            path, json={"message": "x", "remind_in_seconds": 60}, headers=headers
        )
    verbs = {"GET": client.get, "POST": client.post, "DELETE": client.delete}
    return await verbs[method](path, headers=headers)


async def ann_and_bob(client: Client, conn: Connection) -> tuple[JSON, JSON, dict[str, int]]:
    """Ann (with a reminder and an export) and Bob; the ids of Ann's resources."""
    ann = await create_user(client)
    reminder = await create_reminder(client, ann["id"], message="hi", remind_in_seconds=60)
    export = await (await client.post(f"/users/{ann['id']}/exports")).get_json()
    bob = await create_user(client, "Bob", "bob@example.com")
    ids = {
        "user": ann["id"],
        "key": ann["api_key_id"],
        "reminder": reminder["id"],
        "export": export["id"],
    }
    return ann, bob, ids


async def snapshot(conn: Connection) -> list[Any]:
    return [
        await conn.fetch(f"SELECT * FROM {table} ORDER BY id")
        for table in ("users", "reminders", "exports", "api_keys", "job")
    ]


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("wrong", list(WRONG_KEYS))
async def test_without_a_valid_key_is_401_and_changes_nothing(
    client: Client, conn: Connection, method: str, path: str, wrong: str
) -> None:
    ann, _, ids = await ann_and_bob(client, conn)
    authorization = WRONG_KEYS[wrong]
    if wrong == "right id, wrong secret":
        authorization = f"Bearer jq_{ann['api_key_id']}_" + "b" * 43
    before = await snapshot(conn)
    act_as(client, None)  # the client sends no key of its own
    response = await call(client, method, path.format(**ids), authorization)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    body = await response.get_json()
    assert_error(body, "unauthorized")
    assert ann["api_key"] not in await response.get_data(as_text=True)
    assert await snapshot(conn) == before


@pytest.mark.parametrize(("method", "path"), ROUTES)
async def test_another_users_key_is_404_and_changes_nothing(
    client: Client, conn: Connection, method: str, path: str
) -> None:
    _, bob, ids = await ann_and_bob(client, conn)
    before = await snapshot(conn)
    response = await call(client, method, path.format(**ids), f"Bearer {bob['api_key']}")
    assert response.status_code == 404
    assert_error(await response.get_json(), "not_found")
    assert await snapshot(conn) == before


async def test_another_users_resource_reads_like_a_missing_one(
    client: Client, conn: Connection
) -> None:
    """The 404 for Ann's reminder, asked with Bob's key, is the 404 of a reminder that does
    not exist (no existence leak)."""
    _, bob, ids = await ann_and_bob(client, conn)
    theirs = await client.get(f"/reminders/{ids['reminder']}", headers=bearer(bob["api_key"]))
    missing = await client.get("/reminders/4242", headers=bearer(bob["api_key"]))
    body, other = await theirs.get_json(), await missing.get_json()
    assert body["detail"]["message"] == other["detail"]["message"] == "no such reminder"


async def test_the_owner_gets_their_resources(client: Client, conn: Connection) -> None:
    ann, _, ids = await ann_and_bob(client, conn)
    act_as(client, ann)
    for path in ("/users/{user}", "/reminders/{reminder}", "/exports/{export}"):
        assert (await client.get(path.format(**ids))).status_code == 200, path


async def test_the_stored_form_is_not_the_key(client: Client, conn: Connection) -> None:
    ann = await create_user(client)
    key = ann["api_key"]
    assert key.startswith(f"jq_{ann['api_key_id']}_")
    assert len(key) > 40
    row = await conn.fetchrow("SELECT * FROM api_keys WHERE id = $1", ann["api_key_id"])
    assert row is not None
    stored = " ".join(str(v) for v in dict(row).values())
    assert key not in stored
    assert key.split("_", 2)[2] not in stored  # the secret, which may hold "_" itself
    assert bytes(row["digest"]) == hashlib.sha256(key.encode()).digest()
    assert bytes(row["digest"]) != key.encode()


async def test_get_user_never_shows_a_key(client: Client) -> None:
    ann = await create_user(client)
    body = await (await client.get(f"/users/{ann['id']}")).get_json()
    assert "api_key" not in body
    assert ann["api_key"] not in str(body)


async def test_rotation_keeps_the_old_key_until_it_is_revoked(
    client: Client, conn: Connection
) -> None:
    ann = await create_user(client)
    old = ann["api_key"]
    response = await client.post(f"/users/{ann['id']}/keys")
    assert response.status_code == 201
    new = await response.get_json()
    assert set(new) == {"id", "user_id", "api_key", "created_at"}
    assert new["user_id"] == ann["id"]
    assert new["api_key"] != old
    for key in (old, new["api_key"]):
        assert (await client.get(f"/users/{ann['id']}", headers=bearer(key))).status_code == 200

    revoked = await client.delete(
        f"/users/{ann['id']}/keys/{ann['api_key_id']}", headers=bearer(new["api_key"])
    )
    assert revoked.status_code == 204
    gone = await client.get(f"/users/{ann['id']}", headers=bearer(old))
    assert gone.status_code == 401
    still = await client.get(f"/users/{ann['id']}", headers=bearer(new["api_key"]))
    assert still.status_code == 200
    assert await conn.fetchval(
        "SELECT revoked_at IS NOT NULL FROM api_keys WHERE id = $1", ann["api_key_id"]
    )
    again = await client.delete(
        f"/users/{ann['id']}/keys/{ann['api_key_id']}", headers=bearer(new["api_key"])
    )
    assert again.status_code == 404


async def test_a_user_can_revoke_the_key_in_use(client: Client) -> None:
    ann = await create_user(client)
    response = await client.delete(f"/users/{ann['id']}/keys/{ann['api_key_id']}")
    assert response.status_code == 204
    assert (await client.get(f"/users/{ann['id']}")).status_code == 401


async def test_a_user_cannot_revoke_another_users_key(client: Client, conn: Connection) -> None:
    ann, bob, _ = await ann_and_bob(client, conn)
    response = await client.delete(
        f"/users/{bob['id']}/keys/{ann['api_key_id']}", headers=bearer(bob["api_key"])
    )
    assert response.status_code == 404
    assert (
        await client.get(f"/users/{ann['id']}", headers=bearer(ann["api_key"]))
    ).status_code == 200


@pytest.fixture
def settings(database_url: str) -> Settings:
    return make_settings(database_url, admin_token=ADMIN_TOKEN, max_keys_per_user=3)


async def test_keys_per_user_are_capped(client: Client, conn: Connection) -> None:
    ann = await create_user(client)
    for _ in range(2):
        assert (await client.post(f"/users/{ann['id']}/keys")).status_code == 201
    response = await client.post(f"/users/{ann['id']}/keys")
    assert response.status_code == 409
    body = await response.get_json()
    assert_error(body, "limit_reached")
    assert body["detail"]["limit"] == 3
    assert await conn.fetchval("SELECT count(*) FROM api_keys") == 3


async def test_no_key_in_log_lines_and_key_actions_are_audited(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        ann = await create_user(client)
        made = await (await client.post(f"/users/{ann['id']}/keys")).get_json()
        await client.delete(f"/users/{ann['id']}/keys/{made['id']}")
        await client.get(f"/users/{ann['id']}", headers=bearer(made["api_key"]))  # revoked: 401
        await client.get(f"/users/{ann['id']}", headers={"Authorization": "Bearer jq_1_nope"})
    for key in (ann["api_key"], made["api_key"]):
        assert key not in caplog.text
        assert key.split("_", 2)[2] not in caplog.text  # the secret, which may hold "_" itself
    audit = [r.getMessage() for r in caplog.records if r.name == "jobq.audit"]
    assert len(audit) == 2
    created, revoked = audit
    assert created.startswith(f"audit actor=user:{ann['id']} key:{ann['api_key_id']}")
    assert f"action=key.create target=key:{made['id']}" in created
    assert f"action=key.revoke target=key:{made['id']}" in revoked
    assert " at=" in created
    assert created.split(" at=")[1].split(" ")[0].endswith("Z")


async def test_admin_actions_are_audited_without_the_token(
    client: Client, conn: Connection, caplog: pytest.LogCaptureFixture
) -> None:
    await conn.execute(
        "INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries,"
        " last_error, created_at, died_at) VALUES (7, 't', '{}', 0, 1, 0, 'boom', now(), now())"
    )
    with caplog.at_level(logging.INFO):
        assert (await client.delete("/jobs/dead/7", headers=ADMIN)).status_code == 204
    audit = [r.getMessage() for r in caplog.records if r.name == "jobq.audit"]
    assert len(audit) == 1
    assert audit[0].startswith("audit actor=admin action=dead_job.discard target=job:7 at=")
    assert ADMIN_TOKEN not in caplog.text


@pytest.mark.parametrize("signup", ["open", "admin"])
async def test_signup_setting(database: Database, database_url: str, signup: str) -> None:
    app = create_app(make_settings(database_url, admin_token=ADMIN_TOKEN, signup=signup))
    use_keyed_client(app)  # acts as the users it creates
    user = {"name": "Ann", "email": "ann@example.com"}
    async with app.test_app() as test_app:
        client = test_app.test_client()
        stranger = await client.post("/users", json=user)
        if signup == "open":
            assert stranger.status_code == 201
        else:
            assert stranger.status_code == 401
            assert_error(await stranger.get_json(), "unauthorized")
            invalid = await client.post("/users", json={"nope": 1})
            assert invalid.status_code == 401  # before validation
            by_admin = await client.post("/users", json=user, headers=ADMIN)
            assert by_admin.status_code == 201
            assert "api_key" in await by_admin.get_json()
        spec = await (await client.get("/openapi.json")).get_json()
    create = spec["paths"]["/users"]["post"]
    assert ("401" in create["responses"]) == (signup == "admin")


def test_admin_signup_needs_an_admin_token(database_url: str) -> None:
    with pytest.raises(ValueError, match="JOBQ_SIGNUP=admin needs JOBQ_ADMIN_TOKEN"):
        make_settings(database_url, signup="admin")


async def test_answers_that_carry_a_new_key_are_never_cached(client: Client) -> None:
    created = await client.post("/users", json={"name": "Ann", "email": "ann@example.com"})
    assert created.status_code == 201
    assert created.headers["Cache-Control"] == "no-store"
    user = await created.get_json()
    another = await client.post(f"/users/{user['id']}/keys")
    assert another.status_code == 201
    assert another.headers["Cache-Control"] == "no-store"
