"""Resilience layers, app-agnostic: circuit breaker → bulkhead → timeout budget → retry (→ idempotency in graph/)."""

from resilience.budget import (
    BUDGET_HEADER,
    BudgetDefaults,
    budget_scope,
    configure_budget,
    current_deadline,
    init_budget,
    outgoing_budget_headers,
    outgoing_budget_seconds,
    parse_budget_header,
    remaining_budget,
    restore_budget_defaults,
)
from resilience.errors import (
    BudgetExhaustedError,
    BulkheadFullError,
    BulkheadTimeoutError,
    CircuitOpenError,
    NonRetryableError,
    ResilienceError,
)

__all__ = [
    "BUDGET_HEADER",
    "BudgetDefaults",
    "BudgetExhaustedError",
    "BulkheadFullError",
    "BulkheadTimeoutError",
    "CircuitOpenError",
    "NonRetryableError",
    "ResilienceError",
    "budget_scope",
    "configure_budget",
    "current_deadline",
    "init_budget",
    "outgoing_budget_headers",
    "outgoing_budget_seconds",
    "parse_budget_header",
    "remaining_budget",
    "restore_budget_defaults",
]
