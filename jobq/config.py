"""Settings: the only reader of the environment (and of `.env`)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AliasChoices,
    BeforeValidator,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from jobq.credentials import (
    MAKE_TOKEN,
    MIN_TOKEN_DISTINCT,
    MIN_TOKEN_LENGTH,
    WEAK_SECRET,
    strong_token,
    webhook_key,
)

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _seconds(value: Any) -> Any:
    """Read a duration given in seconds ("5", "0.25", 5) as a `timedelta`."""
    if isinstance(value, str | int | float) and not isinstance(value, bool):
        return timedelta(seconds=float(value))
    return value


def _unset_if_blank(value: Any) -> Any:
    """Read an empty (or blank) setting as unset: `DATABASE_URL=` in `.env` means none."""
    if isinstance(value, str) and not value.strip():
        return None
    return value


def _names(value: Any) -> Any:
    """Read "a.b, c.d" as ("a.b", "c.d")."""
    if isinstance(value, str):
        return tuple(name.strip() for name in value.split(",") if name.strip())
    return value


def _queue_slots(value: Any) -> Any:
    """Read "reminders:16,exports:2" as {"reminders": 16, "exports": 2}.
    Raises: `ValueError` for an entry that is not `name:slots` with slots >= 1."""
    if not isinstance(value, str):
        return value
    slots: dict[str, int] = {}
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        name, sep, count = entry.partition(":")
        if not sep or not name.strip() or not count.strip().isdigit() or int(count) < 1:
            raise ValueError(f"{entry!r} is not name:slots (slots a whole number >= 1)")
        if name.strip() in slots:
            raise ValueError(f"queue {name.strip()!r} is named twice")
        slots[name.strip()] = int(count)
    return slots


def _ports(value: Any) -> Any:
    """Read "80, 443" as {80, 443}."""
    if isinstance(value, str):
        return frozenset(int(port) for port in value.split(",") if port.strip())
    return value


Seconds = Annotated[timedelta, BeforeValidator(_seconds)]


def _env(name: str) -> Any:
    """A field read from `JOBQ_<NAME>` that can also be set by its Python name."""
    return AliasChoices(name.lower(), f"JOBQ_{name}")


class Settings(BaseSettings):
    """Every setting of jobq. Durations are `timedelta` here and seconds (`_S`) in the environment.

    Source: the process environment, then `.env` in the working directory, then these defaults.
    Secrets (`database_url`, which may hold a password, `webhook_secret`, `admin_token`) are
    `SecretStr`: masked in `repr()`, and a validation error never echoes any input.
    """

    model_config = SettingsConfigDict(
        env_file=".env",
        extra="ignore",
        populate_by_name=True,
        frozen=True,
        hide_input_in_errors=True,
    )

    database_url: Annotated[SecretStr | None, BeforeValidator(_unset_if_blank)] = Field(
        default=None, validation_alias=AliasChoices("database_url", "DATABASE_URL")
    )
    """PostgreSQL DSN (a secret: it may hold a password) of the pooled connections: the server,
    or a pooler such as PgBouncer in transaction mode. Unset: the embedded server in
    `pgdata_dir` is started and used."""
    direct_database_url: Annotated[SecretStr | None, BeforeValidator(_unset_if_blank)] = Field(
        default=None, validation_alias=_env("DIRECT_DATABASE_URL")
    )
    """DSN straight to the server for the connections that need a session of their own (each
    worker's listener: LISTEN, its liveness lock and its claims; the migrations' lock). Set it
    when `database_url` goes through a transaction-mode pooler; then pooled connections send no
    startup parameter but the pooler's own and prepare no named statement. Unset: the
    `database_url`."""
    pgdata_dir: Path = Field(default=PROJECT_ROOT / ".pgdata", validation_alias=_env("PGDATA_DIR"))
    http_host: str = Field(default="127.0.0.1", validation_alias=_env("HTTP_HOST"))
    http_port: int = Field(default=8000, ge=0, le=65535, validation_alias=_env("HTTP_PORT"))
    max_body_bytes: int = Field(default=64 * 1024, ge=1024, validation_alias=_env("MAX_BODY_BYTES"))
    body_timeout: Seconds = Field(
        default=timedelta(seconds=10), validation_alias=_env("BODY_TIMEOUT_S")
    )
    """How long a request's body may take to arrive, whole, from the end of its headers
    (which have 5 s from the connection's opening: `jobq.__main__.http_config`); past that,
    408 and the connection is closed. 64 KiB in 10 s is 6.5 KB/s."""
    min_pool_size: int = Field(default=2, ge=1, validation_alias=_env("MIN_POOL_SIZE"))
    max_pool_size: int = Field(default=10, ge=1, validation_alias=_env("MAX_POOL_SIZE"))
    db_command_timeout: Seconds = Field(
        default=timedelta(seconds=30), validation_alias=_env("DB_COMMAND_TIMEOUT_S")
    )
    run_workers: bool = Field(default=True, validation_alias=_env("RUN_WORKERS"))
    """Whether `serve` also runs a worker in the web process."""
    max_concurrent_jobs: int = Field(
        default=16, ge=1, le=1024, validation_alias=_env("MAX_CONCURRENT_JOBS")
    )
    """Job slots of one worker process: it never holds more claimed jobs than this."""
    queues: Annotated[dict[str, int], NoDecode, BeforeValidator(_queue_slots)] = Field(
        default_factory=dict, validation_alias=_env("QUEUES")
    )
    """The queues a worker process serves, with its slots for each (`reminders:16,exports:2`
    in the env). Empty: every declared queue, with its declared slots or
    `max_concurrent_jobs`."""
    reminder_user_max_running: int = Field(
        default=2, ge=1, validation_alias=_env("REMINDER_USER_MAX_RUNNING")
    )
    """At most this many deliveries of one user's reminders at once (all workers): a user's
    share of the delivery slots (`jobq.domain.shares`)."""
    reminder_host_max_running: int = Field(
        default=4, ge=1, validation_alias=_env("REMINDER_HOST_MAX_RUNNING")
    )
    """At most this many reminder deliveries to one webhook address at once (all workers): the
    address the host resolves to (an IPv6 address by its /64), whatever the names."""
    reminder_host_rate: int = Field(default=20, ge=1, validation_alias=_env("REMINDER_HOST_RATE"))
    """At most this many reminder deliveries to one webhook address per
    `reminder_host_rate_period`."""
    reminder_host_rate_period: Seconds = Field(
        default=timedelta(seconds=1), validation_alias=_env("REMINDER_HOST_RATE_PERIOD_S")
    )
    max_threads: int = Field(default=4, ge=1, le=256, validation_alias=_env("MAX_THREADS"))
    """Threads for synchronous (plain `def`) handlers."""
    poll_interval: Seconds = Field(
        default=timedelta(seconds=5), validation_alias=_env("POLL_INTERVAL_S")
    )
    lease: Seconds = Field(default=timedelta(seconds=30), validation_alias=_env("LEASE_S"))
    """How long a claimed job stays with a worker that stops heartbeating (a hung worker)."""
    heartbeat_interval: Seconds = Field(
        default=timedelta(seconds=5), validation_alias=_env("HEARTBEAT_INTERVAL_S")
    )
    """How often a worker extends its leases, takes or renews the lead (`jobq.queue.leader`)
    and checks its listener."""
    rescue_interval: Seconds = Field(
        default=timedelta(seconds=1), validation_alias=_env("RESCUE_INTERVAL_S")
    )
    """How often the leader returns the jobs of dead or hung workers to the queue."""
    schedule_interval: Seconds = Field(
        default=timedelta(seconds=1), validation_alias=_env("SCHEDULE_INTERVAL_S")
    )
    """How often the leader enqueues the schedules' coming occurrences (10 s ahead)."""
    drain_timeout: Seconds = Field(
        default=timedelta(seconds=10), validation_alias=_env("DRAIN_TIMEOUT_S")
    )
    job_timeout: Seconds = Field(
        default=timedelta(seconds=60), validation_alias=_env("JOB_TIMEOUT_S")
    )
    """Default limit on one attempt of a job; a handler may declare its own."""
    retention: Seconds = Field(default=timedelta(days=7), validation_alias=_env("RETENTION_S"))
    """How long finished jobs (succeeded, cancelled) stay in `job_done` with their result, at
    least: they go a day at a time (0: none is kept)."""
    prune_interval: Seconds = Field(
        default=timedelta(minutes=1), validation_alias=_env("PRUNE_INTERVAL_S")
    )
    """How often the leader prunes finished jobs past the retention."""
    max_result_bytes: int = Field(
        default=64 * 1024, ge=0, validation_alias=_env("MAX_RESULT_BYTES")
    )
    """The largest result a handler may return, as JSON; a larger one fails its job."""
    progress_interval: Seconds = Field(
        default=timedelta(seconds=0.5), validation_alias=_env("PROGRESS_INTERVAL_S")
    )
    """A running job's progress reports reach the database at most this often; the latest of
    the ones in between is written when the interval is up (`jobq.queue.progress`)."""
    backoff_base: Seconds = Field(
        default=timedelta(seconds=2), validation_alias=_env("BACKOFF_BASE_S")
    )
    backoff_max: Seconds = Field(default=timedelta(hours=1), validation_alias=_env("BACKOFF_MAX_S"))
    backoff_jitter: float = Field(default=0.25, ge=0, le=1, validation_alias=_env("BACKOFF_JITTER"))
    """Fraction of each backoff that is randomised away (0: none, 1: full jitter)."""
    webhook_secret: SecretStr | None = Field(default=None, validation_alias=_env("WEBHOOK_SECRET"))
    """The key that signs webhook deliveries (Standard Webhooks): `whsec_` and the base64 of at
    least 32 random bytes; a weaker one is refused at start. Unset: one is made at the first
    start and kept in `webhook_secret_file`."""
    webhook_secret_file: Path = Field(
        default=PROJECT_ROOT / ".webhook-secret", validation_alias=_env("WEBHOOK_SECRET_FILE")
    )
    """Where the webhook secret made when `webhook_secret` is unset is kept (mode 0600), and
    read back at every start."""
    webhook_timeout: Seconds = Field(
        default=timedelta(seconds=10), validation_alias=_env("WEBHOOK_TIMEOUT_S")
    )
    """Read (and write) timeout of a webhook call: the longest wait for the next bytes."""
    webhook_connect_timeout: Seconds = Field(
        default=timedelta(seconds=5), validation_alias=_env("WEBHOOK_CONNECT_TIMEOUT_S")
    )
    """Connect timeout of a webhook call, and the longest DNS lookup of a webhook's host."""
    webhook_total_timeout: Seconds = Field(
        default=timedelta(seconds=15), validation_alias=_env("WEBHOOK_TOTAL_TIMEOUT_S")
    )
    """The deadline of a whole delivery attempt (lookup, connect, send, read the answer): a
    server that trickles its answer cannot stretch an attempt past it."""
    webhook_max_response_bytes: int = Field(
        default=64 * 1024, ge=0, validation_alias=_env("WEBHOOK_MAX_RESPONSE_BYTES")
    )
    """How much of a webhook's answer is read; the rest is not (its status decides)."""
    admin_token: Annotated[SecretStr | None, BeforeValidator(_unset_if_blank)] = Field(
        default=None, validation_alias=_env("ADMIN_TOKEN")
    )
    """Bearer token of the admin endpoints (`/jobs/dead`, `/workers`, `/jobs/stats`,
    `/metrics`) and the dashboard: at least 16 characters, 10 of them different (a weak
    token stops the process at start, saying how to make one). Unset: those endpoints
    answer 404."""
    signup: Literal["open", "admin"] = Field(default="open", validation_alias=_env("SIGNUP"))
    """Who may create users (`POST /users`): `open` (anyone) or `admin` (the admin token)."""
    rate_limit_per_s: float = Field(default=10, ge=0, validation_alias=_env("RATE_LIMIT_PER_S"))
    """Requests per second one API key may make on average (a token bucket per key, per
    process); 0: no limit."""
    rate_limit_burst: int = Field(default=50, ge=1, validation_alias=_env("RATE_LIMIT_BURST"))
    """Requests one API key may make at once before `rate_limit_per_s` applies."""
    signup_rate_per_hour: float = Field(
        default=20, ge=0, validation_alias=_env("SIGNUP_RATE_PER_HOUR")
    )
    """Sign-ups (`POST /users`, open) one client address may make per hour on average, after
    5 at once (`jobq.api.throttle`, per process); 0: no limit."""
    auth_failures_per_min: float = Field(
        default=10, ge=0, validation_alias=_env("AUTH_FAILURES_PER_MIN")
    )
    """Failed credentials (API keys, the admin token, the dashboard's login) one client address
    may send per minute on average, after 10 at once; past that, its requests with a credential
    get 429 until the allowance refills (`jobq.api.throttle`, per process); 0: no limit."""
    max_reminders_per_user: int = Field(
        default=1000, ge=1, validation_alias=_env("MAX_REMINDERS_PER_USER")
    )
    """How many unsent reminders a user may have."""
    max_exports_per_user: int = Field(
        default=100, ge=1, validation_alias=_env("MAX_EXPORTS_PER_USER")
    )
    """How many exports a user may have (they are kept until deleted)."""
    max_export_bytes_per_user: int = Field(
        default=10 * 1024 * 1024, ge=1024, validation_alias=_env("MAX_EXPORT_BYTES_PER_USER")
    )
    """How many bytes a user's export files may take in all: no export is requested past it,
    and one whose file would go past it fails."""
    max_keys_per_user: int = Field(default=10, ge=1, validation_alias=_env("MAX_KEYS_PER_USER"))
    """How many unrevoked API keys a user may have."""
    webhook_allow_private: bool = Field(
        default=False, validation_alias=_env("WEBHOOK_ALLOW_PRIVATE")
    )
    """Local development: allow webhooks to any address and port (loopback and private ones
    included). Off: see `jobq.domain.webhooks`."""
    webhook_ports: Annotated[frozenset[int], NoDecode, BeforeValidator(_ports)] = Field(
        default=frozenset({80, 443, 8080, 8443}), validation_alias=_env("WEBHOOK_PORTS")
    )
    """The ports a webhook may use (comma-separated in the env), unless
    `webhook_allow_private`."""
    job_modules: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_names)] = Field(
        default=(), validation_alias=_env("JOB_MODULES")
    )
    """Modules to import for their handlers, besides `jobq.jobs` (comma-separated in the env)."""
    log_level: str = Field(default="INFO", validation_alias=_env("LOG_LEVEL"))
    web_processes: int = Field(default=0, ge=0, le=256, validation_alias=_env("WEB_PROCESSES"))
    """HTTP server processes that `python -m jobq run` starts; 0: one per CPU."""
    worker_processes: int = Field(
        default=0, ge=0, le=256, validation_alias=_env("WORKER_PROCESSES")
    )
    """Worker processes that `python -m jobq run` starts; 0: one per CPU."""
    crash_loop_restarts: int = Field(default=5, ge=1, validation_alias=_env("CRASH_LOOP_RESTARTS"))
    crash_loop_window: Seconds = Field(
        default=timedelta(seconds=60), validation_alias=_env("CRASH_LOOP_WINDOW_S")
    )
    """`run`: a child restarted more than `crash_loop_restarts` times within this window is a
    crash loop: the supervisor logs an ERROR, stops the others and exits 1."""
    log_format: Literal["text", "json"] = Field(default="text", validation_alias=_env("LOG_FORMAT"))
    """`text` lines, or `json`: one object per line, with the job's id, queue, type, attempt and
    worker on the lines about one (`jobq.logs`)."""
    metrics_flush_interval: Seconds = Field(
        default=timedelta(seconds=5), validation_alias=_env("METRICS_FLUSH_INTERVAL_S")
    )
    """How often a process adds its job counts and timings to the database's (only when it has
    some): the lag of `/metrics` behind the events (`jobq.queue.metrics`). Each busy process
    flushes once per interval, so the database commits a flush per busy process per interval;
    5 s is still three times a typical scrape's rate."""
    metrics_snapshot_interval: Seconds = Field(
        default=timedelta(seconds=5), validation_alias=_env("METRICS_SNAPSHOT_INTERVAL_S")
    )
    """How often the leader counts the queue depths for `/metrics` (`jobq.queue.leader.depth`)."""

    @field_validator("webhook_secret")
    @classmethod
    def _strong_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and webhook_key(value.get_secret_value()) is None:
            raise ValueError(WEAK_SECRET)
        return value

    @field_validator(
        "reminder_host_rate_period",
        "metrics_flush_interval",
        "metrics_snapshot_interval",
        "webhook_total_timeout",
        "body_timeout",
    )
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be > 0 seconds")
        return value

    @field_validator("admin_token")
    @classmethod
    def _strong_admin_token(cls, value: SecretStr | None) -> SecretStr | None:
        # Guessing is throttled per client address (jobq.api.throttle), which bounds the
        # guesses, not their odds: a short or repetitive token is refused whatever its origin.
        if value is not None and not strong_token(value.get_secret_value()):
            raise ValueError(
                f"too weak: at least {MIN_TOKEN_LENGTH} characters, {MIN_TOKEN_DISTINCT} of them"
                f" different; make one with: {MAKE_TOKEN}"
            )
        return value

    @model_validator(mode="after")
    def _lease_outlasts_a_lost_heartbeat(self) -> Self:
        # A worker extends its leases at each heartbeat, and a server crash can lose the last
        # one (its commit does not wait for the disk: jobq.queue.sql.worker_heartbeat). A lease
        # shorter than two intervals would then run out while its worker lives and runs the job,
        # and the job would be rescued and run a second time (DESIGN.md, guarantee 3).
        if self.lease < 2 * self.heartbeat_interval:
            raise ValueError(
                f"JOBQ_LEASE_S ({self.lease.total_seconds():g}) must be at least twice"
                f" JOBQ_HEARTBEAT_INTERVAL_S ({self.heartbeat_interval.total_seconds():g})"
            )
        return self

    @model_validator(mode="after")
    def _admin_signup(self) -> Self:
        if self.signup == "admin" and self.admin_token is None:
            raise ValueError("JOBQ_SIGNUP=admin needs JOBQ_ADMIN_TOKEN")
        return self

    @property
    def retain(self) -> bool:
        """Whether finished jobs are kept (`retention` > 0)."""
        return self.retention > timedelta(0)

    @property
    def heartbeat_grace(self) -> timedelta:
        """Three heartbeat intervals: how long a worker without its liveness lock still counts
        as alive while its process has a session (its listener reconnecting)."""
        return self.heartbeat_interval * 3
