"""`GET /metrics` is an admin endpoint: 404 with no admin token configured, 401 without the
token or with a wrong one (or a user's API key), the exposition with it; its answer holds no
secret."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from quart.typing import TestClientProtocol as Client

from jobq.config import Settings
from tests.api.conftest import ADMIN, ADMIN_TOKEN
from tests.api.helpers import assert_error, bearer, create_user
from tests.conftest import make_settings


async def test_without_an_admin_token_configured_there_is_no_metrics_page(client: Client) -> None:
    response = await client.get("/metrics", headers=ADMIN)
    assert response.status_code == 404
    assert_error(await response.get_json(), "not_found")


class TestWithAnAdminToken:
    @pytest.fixture
    def settings(self, database_url: str) -> Settings:
        return make_settings(database_url, admin_token=ADMIN_TOKEN)

    @pytest.mark.parametrize(
        "headers",
        [{}, {"Authorization": "Bearer wrong-token-of-some-length"}, {"Authorization": "Basic x"}],
        ids=["none", "wrong", "not-bearer"],
    )
    async def test_is_refused_without_the_token(
        self, client: Client, headers: dict[str, str]
    ) -> None:
        response = await client.get("/metrics", headers=headers)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert_error(await response.get_json(), "unauthorized")

    async def test_a_users_api_key_is_not_the_token(self, client: Client) -> None:
        user = await create_user(client)
        response = await client.get("/metrics", headers=bearer(user["api_key"]))
        assert response.status_code == 401

    async def test_answers_the_exposition_with_no_secret(
        self, client: Client, settings: Settings
    ) -> None:
        response = await client.get("/metrics", headers=ADMIN)
        assert response.status_code == 200
        text = await response.get_data(as_text=True)
        names = {family.name for family in text_string_to_metric_families(text)}
        assert {
            "jobq_jobs",
            "jobq_job_pickup_lag_seconds",
            "jobq_job_run_time_seconds",
            "jobq_queue_jobs",
            "jobq_queue_jobs_held",
            "jobq_queue_oldest_ripe_age_seconds",
            "jobq_queue_paused",
            "jobq_jobs_running",
            "jobq_workers_alive",
            "jobq_vacuum_horizon_age_seconds",
            "jobq_table_dead_tuples",
        } <= names
        assert settings.webhook_secret is not None
        secrets = (ADMIN_TOKEN, settings.webhook_secret.get_secret_value())
        assert not any(secret in text for secret in secrets)

    async def test_is_not_in_the_openapi_document(self, client: Client) -> None:
        spec = await (await client.get("/openapi.json")).get_json()
        assert "/metrics" not in spec["paths"]
