"""Whether the outbound layers are on: one process-wide switch, so one stack can run with and without them.

On (always, unless switched): ``ResiliencePolicy.call`` goes breaker → bulkhead → bounded execution → retry. Off:
the call a codebase without the layers makes: the same retries (each attempt started however the dependency is
doing: no breaker), no slot, and no budget either: each attempt waits as long as the client's default timeout
(``BudgetDefaults.default``). Nothing sets it off but ``bench/cascade.py`` and ``concierge demo cascade``, through
the Redis key ``infra.layer_switch`` watches (see ``docs/cascade.md``); ``set_layers`` follows the switches idiom.
"""

from __future__ import annotations

from resilience.switches import Restore

__all__ = ["layers_on", "set_layers"]

_on = True


def layers_on() -> bool:
    return _on


def set_layers(on: bool) -> Restore[bool]:
    """Switch the layers on or off now; leaving ``with set_layers(...):`` puts the previous state back."""
    global _on
    previous, _on = _on, on
    return Restore(previous, _put)


def _put(on: bool) -> None:
    global _on
    _on = on
