"""Whether a failed request ever left this process: ``never_connected(exc)``, without importing httpx.

The error table asks it of every exception it answers (``infra.error_table.may_have_reached``), and every service
answers errors, the providers and the console included, which send no request and need not load httpx (with its
command line's ``click``, ``rich`` and ``pygments`` when those are installed) to start: docs/benchmarks.md#start-up.
A process that has not imported httpx cannot hold one of its exceptions, so looking the classes up in
``sys.modules`` misses none.
"""

from __future__ import annotations

import sys

from errors.causes import causes

__all__ = ["never_connected"]


def never_connected(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) says the request never left: the connection did not open.

    Then the callee cannot have acted on it; any other failure after sending (a read timeout, a reset) may have.
    httpx's errors raised before a byte of the request left: ``ConnectError``, ``ConnectTimeout`` (no connection
    opened) and ``PoolTimeout`` (none free in the pool).
    """
    httpx = sys.modules.get("httpx")
    if httpx is None:
        return False
    never_sent = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
    return any(isinstance(seen, never_sent) for seen in (exc, *causes(exc, context=True)))
