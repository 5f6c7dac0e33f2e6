"""The OpenAPI document against the server: every answer the server gives to each operation,
provoked on purpose (success, no key, another user's key, a wrong method, too large, not
JSON, malformed, invalid, a crash), is documented for that operation, with its media type,
headers and a schema its body validates against. Operation ids are unique and plain; models
are named components, each written once and referenced."""

from __future__ import annotations

import re
from typing import Any

import jsonschema_rs
import pytest
from quart.typing import TestClientProtocol as Client

from jobq.config import Settings
from jobq.db import Connection
from jobq.domain import users
from jobq.queue import Job, Workflow, enqueue_workflow
from tests.api.conftest import ADMIN, ADMIN_TOKEN, RunJobs
from tests.api.helpers import JSON, act_as, bearer, create_reminder, create_user
from tests.conftest import make_settings

METHODS = ("get", "post", "put", "patch", "delete")
BODIES = {
    ("/users", "post"): {"name": "Cy", "email": "cy@example.com"},
    ("/users/{user_id}/reminders", "post"): {"message": "hi", "remind_in_seconds": 60},
}


@pytest.fixture
def settings(database_url: str) -> Settings:
    return make_settings(database_url, admin_token=ADMIN_TOKEN, max_body_bytes=2048)


async def spec_of(client: Client) -> JSON:
    spec: JSON = await (await client.get("/openapi.json")).get_json()
    return spec


def check_answer(
    spec: JSON, path: str, method: str, status: int, headers: Any, body: bytes, media: str | None
) -> None:
    """Assert that the answer is documented for the operation, body and headers included."""
    operation = spec["paths"][path][method]
    documented = operation["responses"]
    where = (method, path, status)
    assert str(status) in documented, where
    response = documented[str(status)]
    for name, header in response.get("headers", {}).items():
        if header.get("required"):
            assert name in headers, (where, name)
    if not body:
        assert "content" not in response, where
        return
    content = response["content"]
    assert media in content, (where, media, list(content))
    if media == "application/json":
        schema = {**content[media]["schema"], "components": spec["components"]}
        jsonschema_rs.validator_for(schema).validate(__import__("json").loads(body))


async def scene(client: Client, conn: Connection, run_jobs: RunJobs) -> dict[str, Any]:
    """Ann with a reminder, an export (done) and a spare key; Bob; dead job 7; a workflow. Path
    ids."""
    ann = await create_user(client)
    reminder = await create_reminder(client, ann["id"], message="hi", remind_in_seconds=60)
    export = await (await client.post(f"/users/{ann['id']}/exports")).get_json()
    await run_jobs()
    spare = await (await client.post(f"/users/{ann['id']}/keys")).get_json()
    bob = await create_user(client, "Bob", "bob@example.com")
    await conn.execute(
        "INSERT INTO job_dead (id, job_type, arguments, priority, attempts, max_retries,"
        " last_error, created_at, died_at) VALUES (7, 't', '{}', 0, 1, 0, 'boom', now(), now())"
    )
    flow = Workflow("contract")
    flow.add(Job(job_type="t"))
    workflow = await enqueue_workflow(flow)
    return {
        "ids": {
            "workflow_id": workflow.id,
            "user_id": ann["id"],
            "key_id": spare["id"],
            "reminder_id": reminder["id"],
            "export_id": export["id"],
            "job_id": 7,
            "name": "default",  # a queue
        },
        "ann": bearer(ann["api_key"]),
        "bob": bearer(bob["api_key"]),
    }


async def test_every_answer_is_documented(
    client: Client,
    conn: Connection,
    run_jobs: RunJobs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = await spec_of(client)
    seen: set[tuple[str, str, int]] = set()
    asked: list[tuple[str, str, int]] = []

    async def ask(
        path: str, method: str, headers: dict[str, str], *, verb: str | None = None, **kw: Any
    ) -> int:
        url = path.format(**ids)
        act_as(client, None)  # only `headers` (POST /users makes the client someone)
        response = await client.open(url, method=(verb or method).upper(), headers=headers, **kw)
        body = await response.get_data(as_text=False)
        check_answer(
            spec,
            path,
            method,
            response.status_code,
            response.headers,
            body,
            response.mimetype,
        )
        seen.add((method, path, response.status_code))
        asked.append((method, path, response.status_code))
        return response.status_code

    the_scene = await scene(client, conn, run_jobs)
    ids = the_scene["ids"]
    for path, item in spec["paths"].items():
        secured = {name for op in item.values() for r in op.get("security", []) for name in r}
        own = ADMIN if "admin_token" in secured else the_scene["ann"]
        for method, operation in item.items():
            has_body = "requestBody" in operation
            json_body = BODIES.get((path, method))
            # the wrong method (405) on this path
            wrong = next(m for m in METHODS if m not in item)
            status = await ask(path, method, own, verb=wrong)
            assert status == 405
            # too large, not JSON
            assert await ask(path, method, own, data=b"x" * 4096) == 413
            if method == "post":
                status = await ask(path, method, {**own, "Content-Type": "text/plain"}, data=b"hi")
                assert status == 415
            if has_body:
                assert (
                    await ask(path, method, {**own, "Content-Type": "application/json"}, data=b"{")
                    == 400
                )
                assert await ask(path, method, own, json={"nope": 1}) == 422
            if secured:
                assert await ask(path, method, {}) == 401, asked[-1]
                if "api_key" in secured:
                    assert await ask(path, method, the_scene["bob"]) == 404
            if path.endswith("{export_id}"):
                await ask(path, method, {**own, "Accept": "text/calendar"})
            # the success last (it may delete what the others need)
            await ask(path, method, own, json=json_body) if json_body else await ask(
                path, method, own
            )

    # a crash is a documented 500
    async def boom(user_id: int) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(users, "get_user", boom)
    assert await ask("/users/{user_id}", "get", the_scene["ann"]) == 500
    assert ("get", "/users/{user_id}", 200) in seen  # the success was seen too


async def test_operation_ids_are_unique_and_plain(client: Client) -> None:
    spec = await spec_of(client)
    ids = [op["operationId"] for item in spec["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))
    for operation_id in ids:
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", operation_id), operation_id
        assert not re.match(r"(get|post|delete)_(get|post|delete|create|list)_", operation_id)
    assert {"get_user", "create_reminder"} <= set(ids)


def schemas_in(node: Any) -> list[JSON]:
    """Every schema object under `node` that has properties (an object model)."""
    found: list[JSON] = []
    if isinstance(node, dict):
        if "properties" in node:
            found.append(node)
        for value in node.values():
            found += schemas_in(value)
    elif isinstance(node, list):
        for value in node:
            found += schemas_in(value)
    return found


async def test_models_are_named_components_written_once(client: Client) -> None:
    spec = await spec_of(client)
    components = spec["components"]["schemas"]
    # no model written inline in an operation: every JSON body is a reference
    assert schemas_in(spec["paths"]) == []
    for item in spec["paths"].values():
        for operation in item.values():
            bodies = [r.get("content", {}) for r in operation["responses"].values()]
            bodies.append(operation.get("requestBody", {}).get("content", {}))
            for content in bodies:
                if "application/json" in content:
                    assert set(content["application/json"]["schema"]) == {"$ref"}
    # one User, one Reminder, one status enum each, referenced where used
    assert {"User", "Reminder", "ReminderStatus", "Export", "ExportStatus", "Error"} <= set(
        components
    )
    assert components["Reminders"]["properties"]["reminders"]["items"] == {
        "$ref": "#/components/schemas/Reminder"
    }
    status_enums = [
        name for name, schema in components.items() if "enum" in schema and "Status" in name
    ]
    assert sorted(status_enums) == ["ExportStatus", "ReminderStatus"]
    inline_enums = [
        (name, field)
        for name, schema in components.items()
        for field, prop in schema.get("properties", {}).items()
        if "enum" in prop
    ]
    assert inline_enums == []
    # one time format: date-time, answered with Z (checked on bodies elsewhere)
    assert components["Reminder"]["properties"]["remind_at"]["format"] == "date-time"


async def test_length_and_url_rules_match_the_server(client: Client, conn: Connection) -> None:
    """The document's length and pattern rules are the server's: raw lengths, not blank, and
    http(s) URLs only."""
    spec = await spec_of(client)
    new_user = spec["components"]["schemas"]["NewUser"]["properties"]
    message = spec["components"]["schemas"]["NewReminder"]["properties"]["message"]
    assert (message["minLength"], message["maxLength"], message["pattern"]) == (1, 1000, r"\S")
    url = new_user["webhook_url"]["anyOf"][0]
    assert url["pattern"] == "^[Hh][Tt][Tt][Pp][Ss]?://"
    ann = await create_user(client)
    path = f"/users/{ann['id']}/reminders"
    cases = {
        "   ": 422,  # blank: the pattern
        " " * 999 + "x": 201,  # 1,000 characters as sent
        " " * 1000 + "x": 422,  # 1,001 characters as sent
    }
    for text, status in cases.items():
        response = await client.post(path, json={"message": text, "remind_in_seconds": 60})
        assert response.status_code == status, (len(text), await response.get_data())
    for webhook, status in [("ftp://x.example.com/", 422), ("HTTP://x.example.com/", 201)]:
        response = await client.post(
            "/users", json={"name": "W", "email": f"w{status}@example.com", "webhook_url": webhook}
        )
        assert response.status_code == status, webhook
    assert spec["paths"]["/users/{user_id}/exports"]["post"]["responses"]["202"]["headers"][
        "Location"
    ]["required"]
