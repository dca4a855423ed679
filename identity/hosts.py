"""Which ``Host`` a service answers: the matcher of the shell's DNS-rebinding guard (stdlib only).

A page on a rebinding domain reaches a service through the browser of someone who can reach it, with
``Host: evil.example``; a service that answers only its own names cannot be driven that way. ``infra/settings.py``
validates ``CONCIERGE_ALLOWED_HOSTS`` with ``parse_allowed_hosts``; the guard itself is
``infra.service.middleware.HostCheckMiddleware``. Why these rules: docs/service-shell.md.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ANY_HOST", "AllowedHosts", "host_name", "is_local_host", "parse_allowed_hosts"]

ANY_HOST = "*"
"""The ``CONCIERGE_ALLOWED_HOSTS`` entry that turns the guard off (behind a proxy that checks ``Host`` itself)."""

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_PORT = re.compile(r"[0-9]{0,5}")
_MAX_NAME = 253


def _name(text: str) -> str | None:
    """``text`` as a DNS name (lower case, one trailing dot dropped), or None when it is not one."""
    name = text.lower().removesuffix(".")
    return name if len(name) <= _MAX_NAME and _NAME.fullmatch(name) else None


def _ip(text: str) -> str | None:
    """``text`` as an IP literal (IPv6 in brackets, as a ``Host`` carries it), compressed; None when it is not."""
    try:
        if text.startswith("[") and text.endswith("]"):
            return f"[{ipaddress.IPv6Address(text[1:-1]).compressed}]"
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        return None


def host_name(header: str) -> str | None:
    """The host of a ``Host`` header value without its port: a lower-case name or an IP literal; None when the
    value is not a host (empty, a bad port, a stray character)."""
    value = header.strip()
    if value.startswith("["):
        address, bracket, rest = value.partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        host, port = address + bracket, (rest[1:] if rest else None)
    else:
        host, colon, port_text = value.rpartition(":")
        host, port = (host, port_text) if colon else (value, None)
    if port is not None and not _PORT.fullmatch(port):
        return None
    return _ip(host) or _name(host)


def is_local_host(host: str) -> bool:
    """Whether ``host`` (a name or an IP literal, brackets optional) is this machine or its network: ``localhost``
    (and names under ``.localhost``), a loopback or a private address. Names are not resolved: a name that is
    not ``localhost`` is not local here."""
    name = host.strip().lower().removesuffix(".").removeprefix("[").removesuffix("]")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return address.is_loopback or address.is_private


@dataclass(frozen=True)
class AllowedHosts:
    """The names one service answers: exact ``names``, any name under one of ``domains``, or anything at all.

    Always allowed besides: every IP literal (no DNS to rebind: a page addressed by IP is that address's own
    origin) and the loopback names, ``localhost`` and every name under ``.localhost`` (RFC 6761).
    """

    names: frozenset[str]
    domains: tuple[str, ...] = ()
    """Each with its leading dot: ``.example.com`` matches ``a.example.com``, not ``example.com`` itself."""
    any_host: bool = False

    @classmethod
    def of(cls, names: Iterable[str], entries: Iterable[str] = ()) -> AllowedHosts:
        """``names`` taken exactly (a service's own); ``entries`` as ``parse_allowed_hosts`` returns them."""
        exact = {n for n in (_ip(name) or _name(name) for name in names) if n}
        domains: list[str] = []
        any_host = False
        for entry in entries:
            if entry == ANY_HOST:
                any_host = True
            elif entry.startswith("*."):
                domains.append(entry[1:])
            elif entry.startswith("."):
                exact.add(entry[1:])
                domains.append(entry)
            else:
                exact.add(entry)
        return cls(frozenset(exact), tuple(dict.fromkeys(domains)), any_host)

    def allows(self, host: str | None) -> bool:
        """Whether a request with this ``Host`` (as sent, port and all) may be served; ``None``: no header at all,
        which no browser sends (HTTP/1.0 without one), so it cannot be a rebinding."""
        if host is None or self.any_host:
            return True
        name = host_name(host)
        if name is None:
            return False
        if name in self.names or _ip(name) or name == "localhost" or name.endswith(".localhost"):
            return True
        return any(name.endswith(domain) for domain in self.domains)


def parse_allowed_hosts(text: str) -> tuple[str, ...]:
    """``CONCIERGE_ALLOWED_HOSTS`` (comma-separated) into its entries, lower case; ``ValueError`` naming a bad one.

    An entry is a name (``booking.example.com``), ``.example.com`` (that name and every name under it),
    ``*.example.com`` (every name under it, not itself), or ``*`` (any host: the guard is off). No ports.
    """
    entries: list[str] = []
    for raw in text.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == ANY_HOST:
            entries.append(entry)
            continue
        prefix = "*." if entry.startswith("*.") else "." if entry.startswith(".") else ""
        rest = entry[len(prefix) :]
        valid = (_ip(rest) if not prefix else None) or _name(rest)
        if valid is None:
            raise ValueError(
                f"{raw.strip()!r} is not a host name (expected a name, .domain, *.domain or *; no port, no scheme)"
            )
        entries.append(prefix + valid)
    return tuple(dict.fromkeys(entries))
