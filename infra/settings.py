"""Process configuration, read once from the environment.

Every knob of the stack lives here so that one table (the README's) documents them all. Settings are frozen:
a request never changes them; tests change the environment and call ``get_settings.cache_clear()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from domain.llm import PRIMARY_MODEL
from identity.hosts import is_local_host, parse_allowed_hosts
from infra.redis_url import parse_redis_url


@dataclass(frozen=True)
class ModelLimits:
    """How long one call to a model endpoint may wait for its first token, and take whole."""

    first_token_s: float
    call_s: float


class Settings(BaseSettings):
    model_config = SettingsConfigDict(frozen=True, extra="ignore", case_sensitive=False)

    # storage
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias="REDIS_URL",
        description="One server (redis://), a Sentinel master (redis+sentinel://) or a Cluster (redis+cluster://).",
    )
    redis_max_connections: int = Field(
        100,
        validation_alias="REDIS_MAX_CONNECTIONS",
        ge=1,
        description="Connections in each process's Redis pool; beyond them a command waits for one (REDIS_POOL_TIMEOUT).",
    )
    redis_pool_timeout_s: float = Field(
        5.0,
        validation_alias="REDIS_POOL_TIMEOUT",
        gt=0,
        description="How long a command waits for a free pooled connection before failing (dependency_unavailable).",
    )
    redis_wait_replicas: int = Field(
        1,
        validation_alias="REDIS_WAIT_REPLICAS",
        ge=0,
        description=(
            "Replicas a promised write (a booking's acceptance, a provider's side effect) waits for with WAIT before "
            "it is answered, when the master has replicas at all; 0 never waits (docs/redis-ha.md)."
        ),
    )
    redis_wait_timeout_ms: int = Field(
        500,
        validation_alias="REDIS_WAIT_TIMEOUT_MS",
        gt=0,
        description="The longest a promised write waits for its replicas; past it the answer goes out (logged).",
    )
    database_url: str | None = Field(None, validation_alias="DATABASE_URL")
    key_prefix: str = Field("concierge", validation_alias="CONCIERGE_KEY_PREFIX", min_length=1)
    data_dir: Path = Field(Path(".concierge"), validation_alias="CONCIERGE_DATA_DIR")

    # observability
    otlp_endpoint: str | None = Field(None, validation_alias="OTEL_EXPORTER_OTLP_ENDPOINT")
    # tests (and curious users) can have every span appended to a JSON-lines file
    span_file: Path | None = Field(None, validation_alias="CONCIERGE_SPAN_FILE")
    log_level: str = Field("INFO", validation_alias="CONCIERGE_LOG_LEVEL")
    # uvicorn's line per request: off by default, the request metrics and spans say more for less (a log record
    # and a write per request, eight requests per booking)
    access_log: bool = Field(False, validation_alias="CONCIERGE_ACCESS_LOG")
    # young-generation threshold of the garbage collector (process/gc_tuning.py); 0 keeps CPython's default
    gc_gen0_threshold: int = Field(20_000, validation_alias="CONCIERGE_GC_GEN0_THRESHOLD", ge=0)

    # what one client can hold of a service (infra/service/server.py; docs/people.md)
    header_read_timeout_s: float = Field(
        10.0,
        validation_alias="HEADER_READ_TIMEOUT_S",
        gt=0,
        description="A request's line and headers must arrive within this; then 408 and the connection closed.",
    )
    body_read_timeout_s: float = Field(
        30.0,
        validation_alias="BODY_READ_TIMEOUT_S",
        gt=0,
        description="A request's body must arrive within this of its headers; then 408 and the connection closed.",
    )
    server_max_connections: int = Field(
        1000,
        validation_alias="SERVER_MAX_CONNECTIONS",
        ge=1,
        description="Connections (or requests in flight) a service holds at once; beyond them a request gets 503.",
    )
    keep_alive_idle_s: int = Field(
        5,
        validation_alias="KEEP_ALIVE_IDLE_S",
        ge=1,
        description="An idle keep-alive connection is closed after this many seconds.",
    )

    # timeout budget
    default_budget_s: float = Field(30.0, validation_alias="CONCIERGE_DEFAULT_BUDGET_S", gt=0)
    max_budget_s: float = Field(120.0, validation_alias="CONCIERGE_MAX_BUDGET_S", gt=0)
    budget_margin_s: float = Field(0.05, validation_alias="CONCIERGE_BUDGET_MARGIN_S", ge=0)
    booking_budget_s: float = Field(60.0, validation_alias="BOOKING_BUDGET_S", gt=0)
    booking_max_in_flight: int | None = Field(
        None,
        validation_alias="BOOKING_MAX_IN_FLIGHT",
        ge=1,
        description=(
            "Set: a fixed cap of booking runs one booking-agent takes at once; beyond it POST /bookings answers 429 "
            "with Retry-After. Unset: the door adapts to the runs' latency (docs/overload.md) up to the default cap, "
            "twice the narrowest outbound bulkhead every run goes through (search_agent and payment_api, 20 slots: "
            "40), so a run queued at a full bulkhead waits behind about one call, and at most half of "
            "REDIS_MAX_CONNECTIONS, since a run may hold two connections at once (its step's and its heartbeat's)."
        ),
    )

    # start-up overrides of the resilience tables, JSON: {"hotel_api": {"recovery_timeout": 2}} (demos, tests)
    circuit_overrides: dict[str, dict[str, float]] = Field(default_factory=dict, validation_alias="CONCIERGE_CIRCUITS")

    # idempotent nodes
    idempotency_ttl_s: int = Field(7 * 24 * 3600, validation_alias="IDEMPOTENCY_TTL_S", gt=0)
    idempotency_lease_s: float = Field(3.0, validation_alias="IDEMPOTENCY_LEASE_S", gt=0)

    # every booking's journal (infra/journal.py): entries kept per booking, and for how long after the last one
    # (also how long a booking stays in the GET /bookings index)
    journal_max_len: int = Field(1000, validation_alias="JOURNAL_MAX_LEN", gt=0)
    journal_ttl_s: int = Field(7 * 24 * 3600, validation_alias="JOURNAL_TTL_S", gt=0)

    # service-to-service: the per-deployment secret that signs every service token (identity/auth.py); no default,
    # a service refuses to start without it. CONCIERGE_SERVICE_TOKEN, the static bearer it replaces, is retired:
    # nothing reads it and no service accepts it.
    service_secret: SecretStr | None = Field(None, validation_alias="CONCIERGE_SERVICE_SECRET")
    # the simulated providers' /admin routes (faults, ledgers, availability): off (404) when unset
    admin_token: SecretStr | None = Field(None, validation_alias="CONCIERGE_ADMIN_TOKEN")
    # people (identity/people.py, docs/deploy.md): who calls the public APIs (/bookings, /chats), as a bearer JWT
    auth: Literal["on", "off"] = Field(
        "on",
        validation_alias="CONCIERGE_AUTH",
        description="off: every public request is the person `anonymous` (tests and experiments only; a WARNING).",
    )
    auth_issuer: str | None = Field(
        None, validation_alias="CONCIERGE_AUTH_ISSUER", min_length=1, description="The trusted issuer: `iss` equals it."
    )
    auth_audience: str = Field(
        "concierge", validation_alias="CONCIERGE_AUTH_AUDIENCE", min_length=1, description="`aud` must contain it."
    )
    auth_jwks_url: str | None = Field(
        None, validation_alias="CONCIERGE_AUTH_JWKS_URL", min_length=1, description="The issuer's `jwks_uri`."
    )
    auth_jwks_file: Path | None = Field(
        None, validation_alias="CONCIERGE_AUTH_JWKS_FILE", description="The issuer's JWKS as a file (a local issuer)."
    )
    auth_max_token_age_s: float = Field(
        86_400.0,
        validation_alias="CONCIERGE_AUTH_MAX_TOKEN_AGE_S",
        gt=0,
        description="A person's token is refused once older than this (from `iat`), or when its `exp` is further than "
        "this from `iat`, whatever its issuer signed: a leaked token is not good for a century.",
    )
    person_requests_per_min: int | None = Field(
        600,
        validation_alias="PERSON_REQUESTS_PER_MIN",
        ge=1,
        description="Public API requests a person may make a minute.",
    )
    person_max_streams: int | None = Field(
        10, validation_alias="PERSON_MAX_STREAMS", ge=1, description="Journal streams a person may have open at once."
    )
    person_max_chats: int | None = Field(
        200,
        validation_alias="PERSON_MAX_CHATS",
        ge=1,
        description="Chats a person may keep at once (each kept JOURNAL_TTL_S): a new one beyond is 429.",
    )
    person_tokens_per_day: int | None = Field(
        200_000,
        validation_alias="PERSON_TOKENS_PER_DAY",
        ge=1,
        description="Model tokens a person's chats may spend a day.",
    )
    # the web console's login (stack/webconsole, docs/console.md): the one-time link, and the session it opens
    console_login_ttl_s: float = Field(
        3600.0,
        validation_alias="CONSOLE_LOGIN_TTL_S",
        gt=0,
        description="How long a one-time console login link (`concierge up`, `concierge console-url`) can be opened.",
    )
    console_session_ttl_s: float = Field(
        43_200.0,
        validation_alias="CONSOLE_SESSION_TTL_S",
        gt=0,
        description="How long a console session (its cookie) lasts; a person's ends with their token at the latest.",
    )
    search_agent_url: str = Field("http://127.0.0.1:8001", validation_alias="SEARCH_AGENT_URL")
    booking_agent_url: str = Field("http://127.0.0.1:8000", validation_alias="BOOKING_AGENT_URL")
    payment_agent_url: str = Field("http://127.0.0.1:8002", validation_alias="PAYMENT_AGENT_URL")
    hotel_api_url: str = Field("http://127.0.0.1:8010", validation_alias="HOTEL_API_URL")
    payment_api_url: str = Field("http://127.0.0.1:8011", validation_alias="PAYMENT_API_URL")
    hotel_api_key: SecretStr | None = Field(
        None,
        validation_alias="HOTEL_API_KEY",
        description="hotel-api's client key (Authorization: Bearer): on a client, the key it sends; on hotel-api, "
        "the one key it accepts. Unset: each client derives its own from CONCIERGE_SERVICE_SECRET and hotel-api "
        "accepts its clients' (identity.auth.provider_api_key, docs/people.md).",
    )
    payment_api_key: SecretStr | None = Field(
        None,
        validation_alias="PAYMENT_API_KEY",
        description="payment-api's client key, as HOTEL_API_KEY is hotel-api's.",
    )
    llm_api_url: str = Field(
        "http://127.0.0.1:8012",
        validation_alias="LLM_API_URL",
        description="The simulated model provider (llm-api); its OpenAI-compatible API is under /v1.",
    )
    llm_api_key: SecretStr | None = Field(
        None,
        validation_alias="LLM_API_KEY",
        description="The model provider's API key (Authorization: Bearer): what llm-api accepts and the concierge "
        "sends. Unset: both derive one from CONCIERGE_SERVICE_SECRET (identity.auth.llm_api_key, docs/llm-api.md).",
    )
    recovery_worker_url: str = Field("http://127.0.0.1:8020", validation_alias="RECOVERY_WORKER_URL")
    concierge_agent_url: str = Field("http://127.0.0.1:8003", validation_alias="CONCIERGE_AGENT_URL")

    # the concierge (docs/concierge.md): how long a booking waits for the person's approval, and each turn's budget
    approval_ttl_s: float = Field(
        600.0,
        validation_alias="APPROVAL_TTL_S",
        gt=0,
        description="How long a book_hotel approval stays open; a decision after it answers 409 approval_expired.",
    )
    approval_sweep_interval_s: float = Field(
        0.5,
        validation_alias="APPROVAL_SWEEP_INTERVAL_S",
        gt=0,
        description="How often each concierge-agent decides the approvals whose APPROVAL_TTL_S ran out (expired).",
    )
    concierge_turn_budget_s: float = Field(
        120.0,
        validation_alias="CONCIERGE_TURN_BUDGET_S",
        gt=0,
        description="The time budget of one chat turn (its model calls and tools), as BOOKING_BUDGET_S is a booking's.",
    )
    # MCP at concierge-agent's /mcp (docs/mcp.md)
    mcp_wait_s: float = Field(
        20.0,
        validation_alias="MCP_WAIT_S",
        gt=0,
        description="How long an approved MCP tool call waits for the booking's final status before answering "
        "pending (with the booking id to follow); progress notifications meanwhile.",
    )
    mcp_payment_token: str = Field(
        "tok_visa",
        validation_alias="MCP_PAYMENT_TOKEN",
        pattern=r"^tok_[A-Za-z0-9_]+$",
        description="The card a booking made over MCP is charged to: the person's card on file (the simulated "
        "payment-api's token); an MCP client never names one.",
    )

    # the model (infra/llm, docs/model-dependency.md)
    llm_base_url: str | None = Field(
        None,
        validation_alias="LLM_BASE_URL",
        description="The model's OpenAI-compatible base URL as the OpenAI client takes it (…/v1); unset: the "
        "simulator's, LLM_API_URL + /v1 (http://127.0.0.1:8012/v1).",
    )
    llm_model: str = Field(PRIMARY_MODEL, validation_alias="LLM_MODEL", min_length=1)
    llm_timeout_s: float = Field(
        60.0,
        validation_alias="LLM_TIMEOUT_S",
        gt=0,
        description="The longest one model call may take, whole; set, it applies to every endpoint, local or not.",
    )
    llm_first_token_timeout_s: float = Field(
        15.0,
        validation_alias="LLM_FIRST_TOKEN_TIMEOUT_S",
        gt=0,
        description="The longest a model call may wait for its first token (a hung or queued model fails over sooner); "
        "set, it applies to every endpoint, local or not.",
    )
    llm_endpoint_kind: Literal["auto", "local", "remote"] = Field(
        "auto",
        validation_alias="LLM_ENDPOINT_KIND",
        description="Whether a model endpoint is a local one (a CPU model: the LLM_LOCAL_* limits, a warm-up at "
        "start) or a hosted one: auto decides per endpoint by its address (loopback, private or localhost, and not "
        "the simulated llm-api at LLM_API_URL: local); local or remote decide for every endpoint.",
    )
    llm_local_timeout_s: float = Field(
        300.0,
        validation_alias="LLM_LOCAL_TIMEOUT_S",
        gt=0,
        description="LLM_TIMEOUT_S's default for a local endpoint (a CPU model writes a few tokens a second).",
    )
    llm_local_first_token_timeout_s: float = Field(
        60.0,
        validation_alias="LLM_LOCAL_FIRST_TOKEN_TIMEOUT_S",
        gt=0,
        description="LLM_FIRST_TOKEN_TIMEOUT_S's default for a local endpoint: a cold CPU model reads the concierge's "
        "prompt for 10-12 s before its first token.",
    )
    llm_warmup: Literal["auto", "on", "off"] = Field(
        "auto",
        validation_alias="LLM_WARMUP",
        description="concierge-agent sends the model one small request at start, in the background (it loads the "
        "model and caches the system prompt): auto when LLM_BASE_URL's endpoint is local (LLM_ENDPOINT_KIND).",
    )
    llm_guided_tools: Literal["auto", "on", "off"] = Field(
        "auto",
        validation_alias="LLM_GUIDED_TOOLS",
        description="The concierge offers the model only the tools that can succeed in the chat as it stands "
        "(book_hotel once a search has offered hotels, get_booking and cancel_booking once the chat has a booking) "
        "and requires a tool call on a turn's first call until a search has: a small model then searches before it "
        "books. auto: when LLM_BASE_URL's endpoint is local (LLM_ENDPOINT_KIND).",
    )
    llm_max_calls_per_turn: int = Field(8, validation_alias="LLM_MAX_CALLS_PER_TURN", ge=1)
    llm_fallback_model: str | None = Field(
        None,
        validation_alias="LLM_FALLBACK_MODEL",
        description="Asked when the primary's breaker is open, its retries are spent, a wait it asks for does not fit "
        "the turn, or its stream breaks after it started; unset: no fallback.",
    )
    llm_fallback_base_url: str | None = Field(
        None, validation_alias="LLM_FALLBACK_BASE_URL", description="The fallback's base URL; unset: LLM_BASE_URL's."
    )
    llm_turn_token_budget: int | None = Field(
        50_000, validation_alias="LLM_TURN_TOKEN_BUDGET", ge=1, description="Tokens (in + out) one turn may spend."
    )
    llm_chat_token_budget: int | None = Field(
        1_000_000, validation_alias="LLM_CHAT_TOKEN_BUDGET", ge=1, description="Tokens (in + out) one chat may spend."
    )
    llm_rpm: int | None = Field(
        None,
        validation_alias="LLM_RPM",
        ge=1,
        description="The provider's requests per minute, kept by one limiter in Redis for every replica together.",
    )
    llm_tpm: int | None = Field(
        None, validation_alias="LLM_TPM", ge=1, description="The provider's tokens per minute (the same limiter)."
    )
    instance_id: str | None = Field(None, validation_alias="CONCIERGE_INSTANCE_ID")
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (),
        validation_alias="CONCIERGE_ALLOWED_HOSTS",
        description=(
            "More Host names every service answers, comma-separated, besides loopback names, IP addresses, its own "
            "name and the hosts of the *_URL settings (anything else gets 421 host_not_allowed): a name, .example.com "
            "(it and every name under it), *.example.com (every name under it) or * (any; docs/service-shell.md)."
        ),
    )

    # recovery
    run_lease_ttl_s: float = Field(5.0, validation_alias="RUN_LEASE_TTL", gt=0)
    orphan_scan_interval_s: float = Field(1.0, validation_alias="ORPHAN_SCAN_INTERVAL", gt=0)
    recovery_queue_max_size: int = Field(100, validation_alias="RECOVERY_QUEUE_MAX_SIZE", gt=0)
    recovery_queue_warn_threshold: float = Field(0.7, validation_alias="RECOVERY_QUEUE_WARN_THRESHOLD", gt=0, le=1)
    recovery_visibility_timeout_s: float = Field(30.0, validation_alias="RECOVERY_VISIBILITY_TIMEOUT", gt=0)
    recovery_max_attempts: int = Field(3, validation_alias="RECOVERY_MAX_ATTEMPTS", gt=0)
    # a run that fails because something it needs is down (Redis, Postgres, a provider, an open breaker) is not
    # failing: it is retried, backing off up to RECOVERY_OUTAGE_MAX_DELAY, for this long before it counts as failed
    recovery_outage_horizon_s: float = Field(6 * 3600.0, validation_alias="RECOVERY_OUTAGE_HORIZON", gt=0)
    recovery_outage_max_delay_s: float = Field(30.0, validation_alias="RECOVERY_OUTAGE_MAX_DELAY", gt=0)
    durable_agents: Annotated[tuple[str, ...], NoDecode] = Field(
        ("agents.booking", "agents.concierge"),
        validation_alias="DURABLE_AGENTS",
        description="The agent packages whose durable graphs the recovery worker resumes, comma-separated: each "
        "declares them in its durable module (recovery.registry, docs/new-agent.md).",
    )
    recovery_concurrency: int = Field(
        50,
        validation_alias="RECOVERY_CONCURRENCY",
        ge=1,
        description="Runs one recovery worker resumes at once (bulkhead recovery_worker): a replica that dies holding "
        "many runs has them all resumed together; more workers share the orphans.",
    )

    # presence: a dead owner is noticed by its Redis connection (runs/presence.py, docs/presence.md)
    presence_enabled: bool = Field(True, validation_alias="PRESENCE_ENABLED")
    presence_interval_s: float = Field(
        0.2, validation_alias="PRESENCE_INTERVAL", gt=0, description="How often a process renews its instance lease."
    )
    presence_lease_ttl_s: float = Field(
        5.0,
        validation_alias="PRESENCE_LEASE_TTL",
        gt=0,
        description="The instance lease: a process that stops renewing (frozen, host gone) loses its runs after it.",
    )
    presence_grace_s: float = Field(
        0.4,
        validation_alias="PRESENCE_GRACE",
        ge=0,
        description="How long a process's named connection may be missing (a reconnect) before its runs are taken.",
    )
    presence_scan_interval_s: float = Field(
        0.1,
        validation_alias="PRESENCE_SCAN_INTERVAL",
        gt=0,
        description="The orphan scan's interval while presence is on (ORPHAN_SCAN_INTERVAL when it is off).",
    )
    presence_audit_interval_s: float = Field(
        1.0,
        validation_alias="PRESENCE_AUDIT_INTERVAL",
        gt=0,
        description="How often a process checks the runs it holds against the runs it works on: one held but not "
        "worked on in two audits in a row (its release met an outage) is released for recovery.",
    )
    presence_restart_grace_s: float = Field(
        3.0,
        validation_alias="PRESENCE_RESTART_GRACE",
        ge=0,
        description="After Redis restarts or fails over (every connection drops at once), nobody is declared dead "
        "for this long: every process reconnects and renews first.",
    )

    @property
    def llm_primary_base_url(self) -> str:
        """The primary model's base URL: LLM_BASE_URL, or the simulated llm-api's (LLM_API_URL + /v1)."""
        return self.llm_base_url or f"{self.llm_api_url.rstrip('/')}/v1"

    def llm_endpoint_is_local(self, base_url: str) -> bool:
        """Whether ``base_url`` is a local model (LLM_ENDPOINT_KIND): with auto, a loopback or private address (or
        localhost) that is not the simulated llm-api, which answers at once and keeps the hosted limits."""
        if self.llm_endpoint_kind != "auto":
            return self.llm_endpoint_kind == "local"
        endpoint, simulator = urlsplit(base_url), urlsplit(self.llm_api_url)
        try:
            if (endpoint.hostname, endpoint.port) == (simulator.hostname, simulator.port):
                return False
        except ValueError:  # a malformed port: the call will say so; its limits stay the hosted ones
            return False
        return is_local_host(endpoint.hostname or "")

    def llm_limits(self, base_url: str) -> ModelLimits:
        """The endpoint's limits: LLM_FIRST_TOKEN_TIMEOUT_S and LLM_TIMEOUT_S when set (they always win), else
        the LLM_LOCAL_* ones for a local endpoint, else their defaults."""
        local = self.llm_endpoint_is_local(base_url)
        explicit = self.model_fields_set
        first_token = (
            self.llm_local_first_token_timeout_s
            if local and "llm_first_token_timeout_s" not in explicit
            else self.llm_first_token_timeout_s
        )
        call = self.llm_local_timeout_s if local and "llm_timeout_s" not in explicit else self.llm_timeout_s
        return ModelLimits(first_token, call)

    @property
    def llm_warm_up(self) -> bool:
        """Whether concierge-agent warms the primary model up at start (LLM_WARMUP)."""
        if self.llm_warmup == "auto":
            return self.llm_endpoint_is_local(self.llm_primary_base_url)
        return self.llm_warmup == "on"

    @property
    def llm_guides_tools(self) -> bool:
        """Whether the concierge offers the model the tools the chat's state allows (LLM_GUIDED_TOOLS)."""
        if self.llm_guided_tools == "auto":
            return self.llm_endpoint_is_local(self.llm_primary_base_url)
        return self.llm_guided_tools == "on"

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _allowed_hosts(cls, value: object) -> object:
        # ValueError → a settings error naming CONCIERGE_ALLOWED_HOSTS
        return parse_allowed_hosts(value) if isinstance(value, str) else value

    @field_validator("durable_agents", mode="before")
    @classmethod
    def _durable_agents(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        packages = tuple(part.strip() for part in value.split(",") if part.strip())
        for package in packages:
            if not all(name.isidentifier() for name in package.split(".")):
                raise ValueError(f"not a package name: {package!r}")
        return packages

    @field_validator("auth_issuer", "auth_jwks_url", "auth_jwks_file", mode="before")
    @classmethod
    def _auth_unset_when_empty(cls, value: object) -> object:
        # an empty CONCIERGE_AUTH_ISSUER / _JWKS_URL / _JWKS_FILE is unset, as docker-compose.yml passes them
        # (${CONCIERGE_AUTH_JWKS_URL:-}); an empty path would otherwise be "." and an empty URL a validation error
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        parse_redis_url(value)  # ValueError → a settings error naming REDIS_URL
        return value


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings; cached so the environment is parsed once."""
    return Settings()
