"""The console's one-time login links: ``http://<console>/?login=<ticket>``, as Jupyter prints at start.

A ticket is ``v1.<expiry>.<nonce>.<signature>``: an HMAC-SHA256 over the rest with a key derived from the stack's
``CONCIERGE_SERVICE_SECRET``, so whoever holds the stack's secrets (``concierge up``, ``concierge console-url``, an
operator under compose) can mint one without talking to the console or its Redis, and nobody else can. The console
checks the signature and the expiry, then consumes the nonce once (a Redis key that expires with the ticket,
``stack.webconsole.sessions``). Stdlib only: the CLI imports it without the web stack.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from typing import Final
from urllib.parse import quote

__all__ = ["LOGIN_PARAM", "LoginTicketError", "check_ticket", "login_url", "mint_ticket"]

LOGIN_PARAM: Final = "login"
"""The query parameter of the login link (``/?login=...``)."""
_VERSION: Final = "v1"
_PURPOSE: Final = b"concierge console login v1"
MAX_TICKET_CHARS: Final = 200


class LoginTicketError(Exception):
    """A login link that does not open the console: forged, malformed or expired (``str``: why, for the page)."""


def _key(service_secret: str) -> bytes:
    # a key of its own, derived: a ticket is never a service token, and the secret itself signs nothing here
    return hmac.new(service_secret.encode(), _PURPOSE, hashlib.sha256).digest()


def _sign(service_secret: str, body: str) -> str:
    digest = hmac.new(_key(service_secret), body.encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def mint_ticket(service_secret: str, ttl_s: float, *, now: float | None = None) -> str:
    """A ticket good once, for ``ttl_s`` seconds from ``now``."""
    expires = int((time.time() if now is None else now) + ttl_s)
    body = f"{_VERSION}.{expires}.{secrets.token_urlsafe(16)}"
    return f"{body}.{_sign(service_secret, body)}"


def check_ticket(service_secret: str, ticket: str, *, now: float | None = None) -> tuple[str, int]:
    """``(nonce, expiry)`` of a ticket signed with this secret and not expired; ``LoginTicketError`` otherwise.
    Whether it was used already is the caller's to check (the nonce, consumed once)."""
    parts = ticket.split(".") if len(ticket) <= MAX_TICKET_CHARS else []
    if len(parts) != 4 or parts[0] != _VERSION or not parts[1].isdigit():
        raise LoginTicketError("this is not a console login link")
    body = ".".join(parts[:3])
    if not hmac.compare_digest(_sign(service_secret, body), parts[3]):
        raise LoginTicketError("this login link was not made for this stack (its signature does not verify)")
    expires = int(parts[1])
    if (time.time() if now is None else now) > expires:
        raise LoginTicketError("this login link has expired")
    return parts[2], expires


def login_url(console_url: str, service_secret: str, ttl_s: float) -> str:
    """The console's address with a fresh one-time login."""
    return f"{console_url.rstrip('/')}/?{LOGIN_PARAM}={quote(mint_ticket(service_secret, ttl_s), safe='')}"
