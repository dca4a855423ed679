"""Breakers that re-probe sooner (docs/liveness.md): how fast a recovery is noticed against how many requests go
into a dead dependency, for a fixed open duration and one that starts short and doubles.

Run: ``python -m bench.breaker_probes [--rate 100] [--outages 1,5,20,60,300]``. The real ``CircuitBreaker`` on a
simulated clock: callers offer ``--rate`` requests a second to a dependency that is dead for each outage length,
then healthy; a dead call fails at once, a healthy one succeeds at once. Per outage and breaker: the requests that
reached the dead dependency (the calls before the breaker opened and every probe after) and the time from the
recovery to the breaker closing (when callers get through again). Every breaker sees the same offered load in the
same run, and nothing depends on the machine's speed. Prints a markdown table; writes
``bench/results/breaker_probes.json``.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench._stack import machine, write_results
from infra.dependencies import install as install_dependencies
from resilience.circuit_breaker import CIRCUIT_CONFIGS, CircuitBreaker, CircuitBreakerConfig, CircuitState
from resilience.errors import CircuitOpenError

RESULTS = Path(__file__).resolve().parent / "results" / "breaker_probes.json"


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Down(ConnectionError):
    pass


@dataclass(frozen=True)
class Outcome:
    sent_while_dead: int
    """Calls admitted while the dependency was dead (they reached it and failed)."""
    noticed_after_s: float
    """From the recovery to the breaker closing: how long callers kept being refused a dependency that was back."""


def simulate(cfg: CircuitBreakerConfig, outage_s: float, rate: float) -> Outcome:
    clock = _Clock()
    breaker = CircuitBreaker("bench", cfg, clock=clock)
    step = 1.0 / rate
    sent_while_dead = 0
    calls = 0
    while True:
        clock.now = calls * step
        calls += 1
        try:
            ticket = breaker.admit()
        except CircuitOpenError:
            continue
        if clock.now < outage_s:
            sent_while_dead += 1
            breaker.record_exception(_Down("dead"), ticket)
        else:
            breaker.record_success(ticket)
            if breaker.state is CircuitState.CLOSED:
                return Outcome(sent_while_dead, clock.now - outage_s)


def main(argv: Sequence[str] | None = None) -> int:
    install_dependencies()  # the breakers' configs are the dependency table's
    parser = argparse.ArgumentParser(prog="python -m bench.breaker_probes", description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=100.0, help="requests offered per second (default 100)")
    parser.add_argument("--outages", default="1,5,20,60,300", help="outage lengths in seconds, comma-separated")
    parser.add_argument("--dependency", default="hotel_api", choices=sorted(CIRCUIT_CONFIGS))
    parser.add_argument("--output", type=Path, default=RESULTS)
    options = parser.parse_args(argv)
    logging.getLogger("resilience").setLevel(logging.ERROR)  # a line per transition would drown the table
    outages = [float(x) for x in options.outages.split(",") if x.strip()]
    table = CIRCUIT_CONFIGS[options.dependency]
    first = table.initial_recovery_timeout or table.recovery_timeout
    breakers = {
        f"fixed {table.recovery_timeout:g} s (before)": CircuitBreakerConfig(
            failure_threshold=table.failure_threshold,
            success_threshold=table.success_threshold,
            recovery_timeout=table.recovery_timeout,
        ),
        f"fixed {first:g} s": CircuitBreakerConfig(
            failure_threshold=table.failure_threshold,
            success_threshold=table.success_threshold,
            recovery_timeout=first,
        ),
        f"{first:g} s doubling to {table.recovery_timeout:g} s (now)": table,
    }
    rows = {
        name: {f"{outage:g}": vars(simulate(cfg, outage, options.rate)) for outage in outages}
        for name, cfg in breakers.items()
    }
    print(
        f"\n# Breaker probes: {options.dependency} (failure_threshold {table.failure_threshold}, success_threshold "
        f"{table.success_threshold}), {options.rate:g} requests/s offered\n"
    )
    print("| outage | breaker | requests into the dead dependency | recovery noticed after |")
    print("|---:|---|---:|---:|")
    for outage in outages:
        for name in breakers:
            got = rows[name][f"{outage:g}"]
            print(f"| {outage:g} s | {name} | {got['sent_while_dead']} | {got['noticed_after_s']:.2f} s |")
    write_results(
        options.output,
        {"machine": machine(), "options": vars(options) | {"output": str(options.output)}, "rows": rows},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
