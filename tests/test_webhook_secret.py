"""The webhook signing secret (`jobq.domain.signing`): a weak one is refused at start, saying
how to make one; with none set, `make run` (`python -m jobq run`) makes one at its first start,
keeps it, says where, and signs with it (the `standardwebhooks` verifier checks a delivery)."""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from standardwebhooks import Webhook

from jobq.__main__ import main
from jobq.config import PROJECT_ROOT, Settings
from jobq.credentials import webhook_key
from jobq.db import Database
from jobq.domain import signing
from tests.toolkit.procs import free_port, http_ready, in_log, spawn
from tests.toolkit.receiver import WebhookReceiver

SHORT = "whsec_" + base64.b64encode(b"x" * 31).decode()


@pytest.mark.parametrize(
    "secret", ["change-me", "", "a-long-passphrase-that-is-not-base64!", SHORT]
)
def test_a_weak_secret_is_refused_at_start_saying_how_to_make_one(
    secret: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m jobq run` as the program runs it (`jobq.__main__.main`, in this process: the
    refusal comes before any import or connection of the run's), with the environment of
    `tests.toolkit.procs.subprocess_env` and the weak secret."""
    for name in os.environ:
        if name.startswith("JOBQ_") or name in {"DATABASE_URL", "TEST_DATABASE_URL"}:
            monkeypatch.delenv(name)
    monkeypatch.setenv("DATABASE_URL", "postgresql://nowhere.invalid/jobq")
    monkeypatch.setenv("JOBQ_WEBHOOK_SECRET", secret)
    monkeypatch.chdir(PROJECT_ROOT)  # where the program runs, with its `.env` if any
    assert main(["run"]) == 1
    stderr = capsys.readouterr().err
    assert stderr.startswith("jobq: invalid setting JOBQ_WEBHOOK_SECRET: must be whsec_")
    assert "make one with: python3 -c" in stderr
    if secret:
        assert secret not in stderr  # a secret is never echoed
    assert "Traceback" not in stderr


def test_the_secret_is_made_once_and_kept(tmp_path: Path) -> None:
    """Processes starting together make one secret between them (the file is linked into
    place, never overwritten); it is kept with mode 0600 and read back at the next start."""
    path = tmp_path / "state" / "webhook-secret"
    with ThreadPoolExecutor(8) as pool:
        kept = list(pool.map(lambda _: signing.kept_secret(path), range(8)))
    assert len({secret for secret, _ in kept}) == 1
    assert [made for _, made in kept].count(True) == 1
    secret = kept[0][0]
    assert len(webhook_key(secret) or b"") == 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert list(path.parent.iterdir()) == [path]  # no draft left behind
    settings = Settings(_env_file=None, webhook_secret_file=path)
    resolved = signing.with_secret(settings)
    assert resolved.webhook_secret is not None
    assert resolved.webhook_secret.get_secret_value() == secret
    given = Settings(_env_file=None, webhook_secret=signing.new_secret(), webhook_secret_file=path)
    assert signing.with_secret(given) is given

    path.write_text("change-me\n")
    with pytest.raises(ValueError, match="must be whsec_"):
        signing.kept_secret(path)


async def test_make_run_on_a_fresh_machine_makes_a_secret_and_signs_with_it(
    database: Database, receiver: WebhookReceiver, tmp_path: Path
) -> None:
    """`python -m jobq run` with no JOBQ_WEBHOOK_SECRET: it makes one, logs where it keeps it,
    and a delivery verifies under it with the `standardwebhooks` verifier."""
    path = tmp_path / "webhook-secret"
    port = free_port()
    proc = spawn(
        "run",
        "run",
        database_url=database.dsn,
        log_dir=tmp_path,
        env={
            "JOBQ_WEBHOOK_SECRET_FILE": str(path),
            "JOBQ_WEB_PROCESSES": "1",
            "JOBQ_WORKER_PROCESSES": "1",
            "JOBQ_HTTP_HOST": "127.0.0.1",
            "JOBQ_HTTP_PORT": str(port),
            "JOBQ_WEBHOOK_ALLOW_PRIVATE": "true",  # the receiver listens on 127.0.0.1
        },
    )
    try:
        await http_ready(port, proc)
        await in_log(proc, f"made a webhook signing secret and kept it in {path}", within=5)
        secret = path.read_text().strip()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as http:
            user = (
                await http.post(
                    "/users",
                    json={"name": "New", "email": "new@example.com", "webhook_url": receiver.url},
                )
            ).json()
            response = await http.post(
                f"/users/{user['id']}/reminders",
                json={"message": "hello", "remind_in_seconds": 0.5},
                headers={"Authorization": f"Bearer {user['api_key']}"},
            )
            assert response.status_code == 201, response.text
        (request,) = await asyncio.wait_for(receiver.wait_for(1), timeout=30)
        assert Webhook(secret).verify(request.body, request.headers)["message"] == "hello"
        assert "SSRF guard is off" in proc.log()
    finally:
        await proc.stop()
    assert secret not in proc.log()
