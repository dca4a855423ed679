"""Process configuration, read once from the environment.

Every knob of the stack lives here so that one table (the README's) documents them all. Settings are frozen:
a request never changes them; tests change the environment and call ``get_settings.cache_clear()``.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(frozen=True, extra="ignore", case_sensitive=False)

    # storage
    redis_url: str = Field("redis://127.0.0.1:6379/0", validation_alias="REDIS_URL")
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
    # young-generation threshold of the garbage collector (infra/gc_tuning.py); 0 keeps CPython's default
    gc_gen0_threshold: int = Field(20_000, validation_alias="CONCIERGE_GC_GEN0_THRESHOLD", ge=0)

    # timeout budget
    default_budget_s: float = Field(30.0, validation_alias="CONCIERGE_DEFAULT_BUDGET_S", gt=0)
    max_budget_s: float = Field(120.0, validation_alias="CONCIERGE_MAX_BUDGET_S", gt=0)
    budget_margin_s: float = Field(0.05, validation_alias="CONCIERGE_BUDGET_MARGIN_S", ge=0)
    booking_budget_s: float = Field(60.0, validation_alias="BOOKING_BUDGET_S", gt=0)

    # start-up overrides of the resilience tables, JSON: {"hotel_api": {"recovery_timeout": 2}} (demos, tests)
    circuit_overrides: dict[str, dict[str, float]] = Field(default_factory=dict, validation_alias="CONCIERGE_CIRCUITS")

    # idempotent nodes
    idempotency_ttl_s: int = Field(7 * 24 * 3600, validation_alias="IDEMPOTENCY_TTL_S", gt=0)
    idempotency_lease_s: float = Field(3.0, validation_alias="IDEMPOTENCY_LEASE_S", gt=0)

    # service-to-service
    service_token: str = Field("concierge-dev-token", validation_alias="CONCIERGE_SERVICE_TOKEN", min_length=1)
    search_agent_url: str = Field("http://127.0.0.1:8001", validation_alias="SEARCH_AGENT_URL")
    booking_agent_url: str = Field("http://127.0.0.1:8000", validation_alias="BOOKING_AGENT_URL")
    payment_agent_url: str = Field("http://127.0.0.1:8002", validation_alias="PAYMENT_AGENT_URL")
    hotel_api_url: str = Field("http://127.0.0.1:8010", validation_alias="HOTEL_API_URL")
    payment_api_url: str = Field("http://127.0.0.1:8011", validation_alias="PAYMENT_API_URL")
    instance_id: str | None = Field(None, validation_alias="CONCIERGE_INSTANCE_ID")

    # recovery
    run_lease_ttl_s: float = Field(5.0, validation_alias="RUN_LEASE_TTL", gt=0)
    orphan_scan_interval_s: float = Field(1.0, validation_alias="ORPHAN_SCAN_INTERVAL", gt=0)
    recovery_queue_max_size: int = Field(100, validation_alias="RECOVERY_QUEUE_MAX_SIZE", gt=0)
    recovery_queue_warn_threshold: float = Field(0.7, validation_alias="RECOVERY_QUEUE_WARN_THRESHOLD", gt=0, le=1)
    recovery_visibility_timeout_s: float = Field(30.0, validation_alias="RECOVERY_VISIBILITY_TIMEOUT", gt=0)
    recovery_max_attempts: int = Field(3, validation_alias="RECOVERY_MAX_ATTEMPTS", gt=0)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings; cached so the environment is parsed once."""
    return Settings()
