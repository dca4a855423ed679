"""Who is using the console: the operator (a one-time login link, or the admin token) or a person (their bearer
JWT), from a bearer header or a session cookie; the sessions and the consumed links in Redis, each key expiring;
and the operator journal, where every operator action is kept with who did it (``docs/console.md``).

A session is a random id in an HttpOnly, SameSite=Strict cookie; Redis keeps only its hash, with who it is and,
for a person, their token sealed with a key derived from the cookie (AES-GCM): Redis alone opens no session and
shows no token.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import jwt
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from identity.auth import admin_token_ok, bearer_credentials
from identity.people import (
    OPERATOR,
    InvalidPersonTokenError,
    PeopleConfigError,
    PeopleGate,
    PersonVerifier,
    UnauthenticatedError,
)
from infra.journal import encode_entry, instance_id, parse_entries
from infra.redis import key
from infra.settings import Settings, get_settings
from stack.login import LoginTicketError, check_ticket

__all__ = [
    "OPERATOR_ACTION",
    "SESSION_COOKIE",
    "ConsoleGate",
    "ConsoleUser",
    "read_operator_journal",
    "record_operator_action",
]

logger = logging.getLogger(__name__)

SESSION_COOKIE: Final = "concierge_console"
OPERATOR_ACTION: Final = "operator_action"
"""The kind of every operator journal entry."""
OPERATOR_JOURNAL_MAX_LEN: Final = 10_000
NO_LOGIN: Final = (
    "the console needs a login: open the link `concierge up` printed (`concierge console-url` prints another), "
    "or send Authorization: Bearer <a person's token or the admin token>"
)


@dataclass(frozen=True)
class ConsoleUser:
    """Who a console request is from; ``token`` is a person's bearer, relayed as theirs and never shown."""

    who: str
    operator: bool
    via: str
    """``login-url``, ``admin-token`` or ``person-token``."""
    token: str | None = field(default=None, repr=False)
    session: str | None = None
    """The session's public name (a prefix of its hash), for the journal; ``None`` for a bearer request."""

    def relay(self, headers: Mapping[str, str] | None = None) -> dict[str, str]:
        """``headers`` with the person's own ``Authorization`` (the operator's requests keep the admin token)."""
        out = dict(headers or {})
        if self.token is not None:
            out["Authorization"] = f"Bearer {self.token}"
        return out

    def public(self) -> dict[str, Any]:
        return {"who": self.who, "operator": self.operator, "via": self.via}


def _digest(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()[:32]


def _seal_key(sid: str) -> bytes:
    return hashlib.sha256(b"concierge console seal:" + sid.encode()).digest()


class ConsoleGate:
    """Turns a request's bearer or cookie into a ``ConsoleUser``, opens sessions (a login link, a pasted token)
    and closes them."""

    def __init__(
        self,
        *,
        service_secret: str,
        admin_token: str | None,
        verifier: PersonVerifier | None,
        session_ttl_s: float,
        clock: Any = time.time,
    ) -> None:
        self._secret = service_secret
        self._admin = admin_token
        self.verifier = verifier
        self.session_ttl_s = session_ttl_s
        self._clock = clock

    @classmethod
    def from_settings(cls, settings: Settings, service_secret: str, admin_token: str | None) -> ConsoleGate:
        """With ``CONCIERGE_AUTH=off`` or no issuer, people's tokens are not taken here (the operator's are)."""
        verifier = None
        if settings.auth == "on":
            try:
                verifier = PeopleGate.from_settings(settings).verifier
            except PeopleConfigError:
                logger.warning("no issuer of people's tokens is configured: only the operator can log in")
        return cls(
            service_secret=service_secret,
            admin_token=admin_token,
            verifier=verifier,
            session_ttl_s=settings.console_session_ttl_s,
        )

    async def user(self, redis: Any, authorization: str | None, cookie: str | None) -> ConsoleUser:
        """The request's user: its bearer first, else its session; ``UnauthenticatedError`` with neither."""
        if authorization is not None:
            return await self.bearer(authorization)
        if cookie:
            found = await self._session(redis, cookie)
            if found is not None:
                return found
        raise UnauthenticatedError(NO_LOGIN)

    async def bearer(self, authorization: str) -> ConsoleUser:
        """The admin token's operator, or the person a token is for (``InvalidPersonTokenError`` otherwise)."""
        if self._admin is not None and admin_token_ok(authorization, self._admin):
            return ConsoleUser(OPERATOR, operator=True, via="admin-token")
        token = bearer_credentials(authorization)
        if token is None:
            raise InvalidPersonTokenError("not a Bearer credential")
        if self.verifier is None:
            raise InvalidPersonTokenError("people's tokens are not checked here (no issuer): the admin token only")
        person = await self.verifier.verify(token)
        if person.actor is not None:  # a service acting for someone has no business at the console
            raise InvalidPersonTokenError("act: a service's token for a person is not a login")
        return ConsoleUser(person.sub, operator=False, via="person-token", token=token)

    async def open_login(self, redis: Any, ticket: str) -> tuple[str, float]:
        """A session for a one-time link: ``(cookie, ttl_s)``; ``LoginTicketError`` for a forged, expired or used one."""
        nonce, expires = check_ticket(self._secret, ticket, now=self._clock())
        # consumed once: the record outlives the ticket's own expiry, then goes
        used = key("console", "login-used", hashlib.sha256(nonce.encode()).hexdigest()[:32])
        if not await redis.set(used, "1", nx=True, exat=expires + 60):
            raise LoginTicketError("this login link was used already: each opens the console once")
        user = ConsoleUser(OPERATOR, operator=True, via="login-url")
        return await self.open_session(redis, user), self.session_ttl_s

    async def open_session(self, redis: Any, user: ConsoleUser) -> str:
        """A new session for ``user`` (a person's ends with their token at the latest); returns its cookie value."""
        sid = secrets.token_urlsafe(32)
        ttl = self.session_ttl_s
        record: dict[str, Any] = {"who": user.who, "operator": user.operator, "via": user.via, "at": self._clock()}
        if user.token is not None:
            expires = jwt.decode(user.token, options={"verify_signature": False}).get("exp")
            if isinstance(expires, int | float):
                ttl = min(ttl, float(expires) - self._clock())
            nonce = secrets.token_bytes(12)
            sealed = AESGCM(_seal_key(sid)).encrypt(nonce, user.token.encode(), None)
            record["sealed"] = base64.b64encode(nonce + sealed).decode()
        if ttl < 1:
            raise InvalidPersonTokenError("exp: expires too soon for a session")
        await redis.set(key("console", "session", _digest(sid)), json.dumps(record), ex=max(1, int(ttl)))
        return sid

    async def close_session(self, redis: Any, cookie: str) -> None:
        await redis.delete(key("console", "session", _digest(cookie)))

    async def _session(self, redis: Any, sid: str) -> ConsoleUser | None:
        if len(sid) > 100:
            return None
        raw = await redis.get(key("console", "session", _digest(sid)))
        if raw is None:
            return None
        record = json.loads(raw)
        token = None
        if record.get("sealed"):
            blob = base64.b64decode(record["sealed"])
            token = AESGCM(_seal_key(sid)).decrypt(blob[:12], blob[12:], None).decode()
            # the person's token is checked again: a session does not outlive what the issuer would still accept
            await self.bearer(f"Bearer {token}")
        return ConsoleUser(
            str(record["who"]), bool(record["operator"]), str(record["via"]), token, session=_digest(sid)[:12]
        )


def _journal_key() -> str:
    return key("console", "operator-journal")


async def record_operator_action(redis: Any, user: ConsoleUser, action: str, **fields: Any) -> None:
    """One entry in the operator journal (and one log line, which stays when Redis does not take the entry)."""
    entry = {"by": user.who, "via": user.via, "session": user.session, "action": action, **fields}
    logger.info("operator action: %s", " ".join(f"{k}={v}" for k, v in entry.items() if v is not None))
    try:
        journal = _journal_key()
        payload = encode_entry(OPERATOR_ACTION, instance_id(), entry)
        await redis.xadd(journal, {"e": payload}, maxlen=OPERATOR_JOURNAL_MAX_LEN, approximate=True)
        await redis.expire(journal, get_settings().journal_ttl_s)
    except Exception:  # the action happened; its record is the log line above
        logger.warning("operator journal: could not record %s", action, exc_info=True)


async def read_operator_journal(redis: Any, *, after: str | None, count: int) -> list[dict[str, Any]]:
    """The operator journal after stream id ``after`` (exclusive), oldest first."""
    start = "-" if after is None else f"({after}"
    return parse_entries(await redis.xrange(_journal_key(), min=start, max="+", count=count))
