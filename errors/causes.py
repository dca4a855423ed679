"""An exception's chain, walked once: ``causes(exc)``.

Every boundary converts with ``raise ... from exc``, and a chain can loop: an exception raised from one that was,
in turn, raised from it (seen under a Redis Sentinel failover). A walk that follows ``__cause__`` until ``None``
then spins forever on the event loop, and the service stops answering.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["causes"]


def causes(exc: BaseException, *, context: bool = False) -> Iterator[BaseException]:
    """What ``exc`` was raised from, nearest first, each exception once: ``__cause__`` (with ``context``, else the
    ``__context__`` it was raised during)."""
    seen = {id(exc)}
    link = exc.__cause__ or (exc.__context__ if context else None)
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        yield link
        link = link.__cause__ or (link.__context__ if context else None)
