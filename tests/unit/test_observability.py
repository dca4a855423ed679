"""Prometheus and Grafana of docker-compose's ``observability`` profile, checked without running them: Prometheus
scrapes every service of the table, Grafana gets its data source and the dashboard, and every dashboard query is
PromQL over concierge metrics. (That the services expose each metric the dashboard queries is checked against
their real ``/metrics`` in tests/e2e/test_console_stack.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from stack.services import DEPLOYED

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
_METRIC = re.compile(r"\b(?:concierge|gen_ai)_[a-z0-9_]+\b")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded = json.loads((DEPLOY / "grafana" / "dashboards" / "concierge.json").read_text())
    assert isinstance(loaded, dict)
    return loaded


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """``container path → repository path`` of a service's bind mounts."""
    found = {}
    for volume in service["volumes"]:
        source, target, *_ = volume.split(":")
        found[target] = source
    return found


def test_prometheus_scrapes_every_service_of_the_table() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{name}:{spec.port}" for name, spec in DEPLOYED.items() if spec.metrics}
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in config["scrape_configs"])


def test_prometheus_and_grafana_are_an_opt_in_profile_with_their_files_mounted(compose: dict[str, Any]) -> None:
    for name in ("prometheus", "grafana"):
        service = compose["services"][name]
        assert service["profiles"] == ["observability"], name
        for source in mounts(service).values():
            assert (REPO / source).exists(), f"{name} mounts {source}, which is not in the repository"
        assert all(str(port).startswith("127.0.0.1:") for port in service["ports"]), name
    prometheus = mounts(compose["services"]["prometheus"])
    assert prometheus["/etc/prometheus/prometheus.yml"] == "./deploy/prometheus/prometheus.yml"


def test_grafana_provisions_the_data_source_and_the_dashboard(
    compose: dict[str, Any], dashboard: dict[str, Any]
) -> None:
    grafana = mounts(compose["services"]["grafana"])
    provisioning = REPO / grafana["/etc/grafana/provisioning"]
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert [s["type"] for s in sources] == ["prometheus"]
    assert sources[0]["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((provisioning / "dashboards" / "concierge.yml").read_text())["providers"]
    path = providers[0]["options"]["path"]
    assert REPO / grafana[path] == DEPLOY / "grafana" / "dashboards"
    # every panel queries the provisioned data source
    uids = {p["datasource"]["uid"] for p in dashboard["panels"] if p["type"] != "row"}
    assert uids == {sources[0]["uid"]}


def test_the_dashboard_shows_bookings_breakers_bulkheads_queue_and_recovery(dashboard: dict[str, Any]) -> None:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs and all(_METRIC.search(expr) for expr in exprs), exprs
    names = {name for expr in exprs for name in _METRIC.findall(expr)}
    for needed in (
        "concierge_bookings_final_total",
        "concierge_booking_time_to_final_seconds_bucket",
        "concierge_recovery_time_seconds_bucket",
        "concierge_duplicates_prevented_total",
        "concierge_cancel_requests_total",
        "concierge_circuit_state",
        "concierge_bulkhead_in_use",
        "concierge_recovery_queue_depth",
        "concierge_recovery_dlq_depth",
        # the model (docs/model-dependency.md)
        "gen_ai_client_token_usage_sum",
        "gen_ai_client_operation_duration_seconds_bucket",
        "concierge_llm_retries_total",
        "concierge_llm_retry_after_waited_seconds_sum",
        "concierge_llm_fallbacks_total",
        "concierge_llm_budget_stops_total",
        "concierge_llm_limiter_wait_seconds_bucket",
    ):
        assert needed in names, needed
    # balanced parentheses at least: a typo shows up here rather than as an empty panel
    for expr in exprs:
        depth = 0
        for char in expr:
            depth += {"(": 1, ")": -1}.get(char, 0)
            assert depth >= 0, expr
        assert depth == 0, expr
