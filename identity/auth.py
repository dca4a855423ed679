"""Who may call whom: the service tokens between our services, and the admin token of the simulated providers.

**Service tokens.** Every call between our services carries ``Authorization: Bearer <jwt>``: HS256, signed with
``CONCIERGE_SERVICE_SECRET`` (one per deployment, never a default), claims ``iss`` (the calling service), ``aud``
(the called one), ``iat`` and ``exp`` (``TOKEN_TTL_S`` ahead). A token names both ends, so one minted for
payment-agent is worthless at search-agent, and it dies within a minute, so a leaked one is soon worthless
everywhere. The callee checks the signature, the audience (its own name), the times and the lifetime
(``verify_service_token``); the skill then checks the caller (``infra.a2a.server.Skill.callers``).

Signing and checking cost tens of microseconds each, so neither happens per request: a caller mints once per
audience and reuses the token until ``REMINT_BEFORE_S`` of its life is left (``ServiceTokens``), and a callee
remembers the tokens it verified until they expire (``TokenVerifier``).

The process's own name (the ``iss`` of what it mints) is set by the service shell when a service starts
(``use_service_identity``), which also refuses to start without a usable secret.

**Admin token.** The providers' ``/admin`` routes (faults, ledgers, availability) need ``Authorization: Bearer
$CONCIERGE_ADMIN_TOKEN``; with none configured they do not exist (``admin_token_ok``).

**Model API key.** The model provider (llm-api, or any OpenAI-compatible server) takes ``Authorization: Bearer
$LLM_API_KEY``; with none configured, the simulator and the concierge derive the same one (``llm_api_key``).

**Provider client keys.** hotel-api and payment-api take ``Authorization: Bearer <key>`` of one of their clients
(``PROVIDER_CLIENTS``) on every business route, as a real provider issues a key per client: ``HOTEL_API_KEY`` /
``PAYMENT_API_KEY`` when set (the key a client sends, the one key the provider accepts), else one derived per
client from the deployment's secret (``provider_api_key``, checked by ``provider_api_key_ok``).

::

    ServiceAuthError (IdentityError)
     ├── MissingSecretError        CONCIERGE_SERVICE_SECRET unset, too short or a well-known value
     ├── NoServiceIdentityError    a token was to be minted outside a service, with no issuer named
     └── InvalidServiceTokenError  a presented token was refused: .reason (never the token itself)
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

import jwt
from jwt.types import Options

from resilience.switches import Restore

if TYPE_CHECKING:
    from pydantic import SecretStr

__all__ = [
    "ALGORITHM",
    "LEEWAY_S",
    "LLM_KEY_PREFIX",
    "MAX_TOKEN_LIFETIME_S",
    "MIN_SECRET_CHARS",
    "PROVIDER_CLIENTS",
    "PROVIDER_KEY_PREFIX",
    "REMINT_BEFORE_S",
    "TOKEN_TTL_S",
    "IdentityError",
    "InvalidServiceTokenError",
    "MissingSecretError",
    "NoServiceIdentityError",
    "Secrets",
    "ServiceAuthError",
    "ServiceClaims",
    "ServiceTokens",
    "TokenVerifier",
    "acting_for",
    "admin_token",
    "admin_token_ok",
    "bearer_credentials",
    "derived_provider_key",
    "llm_api_key",
    "mint_service_token",
    "person_acted_for",
    "provider_api_key",
    "provider_api_key_ok",
    "service_secret",
    "service_tokens",
    "use_service_identity",
    "verify_service_token",
]

ALGORITHM: Final = "HS256"
TOKEN_TTL_S: Final = 60
"""A minted token's life: ``exp = iat + 60``."""
REMINT_BEFORE_S: Final = 15
"""A caller mints a new token once less than this is left: a request never leaves with one about to expire."""
LEEWAY_S: Final = 5
"""Clock difference tolerated between two hosts when checking ``iat`` and ``exp``."""
MAX_TOKEN_LIFETIME_S: Final = 300
"""A token claiming a longer life (``exp - iat``) is refused, whoever signed it: short-lived means short-lived."""
MIN_SECRET_CHARS: Final = 32
"""HS256 wants a key of at least 256 bits; 32 characters of ``openssl rand -hex 32`` give that and more."""
RETIRED_DEFAULTS: Final = frozenset({"concierge-dev-token"})
"""Values printed in old READMEs: no service takes them as a secret."""
_REQUIRED_CLAIMS: Final = ["iss", "aud", "iat", "exp"]


class IdentityError(Exception):
    """The root of what ``identity`` raises: a service's credential (``ServiceAuthError``) or a person's
    (``identity.people.PeopleError``)."""


class ServiceAuthError(IdentityError):
    """A service credential is missing, unusable or refused."""


class MissingSecretError(ServiceAuthError):
    """``CONCIERGE_SERVICE_SECRET`` is unset or unusable: the service must not start (the message is one line)."""


class NoServiceIdentityError(ServiceAuthError):
    """A token was asked for outside a running service, without naming the issuer."""


class InvalidServiceTokenError(ServiceAuthError):
    """A presented token was refused; ``reason`` says why for the log (the token itself is never repeated)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# ---------------------------------------------------------------------------------------------------- secrets


class Secrets(Protocol):
    """What this module reads of the settings (``infra.settings.Settings`` is one): identity sits below infra, so
    whoever calls hands them in."""

    @property
    def service_secret(self) -> SecretStr | None: ...
    @property
    def admin_token(self) -> SecretStr | None: ...
    @property
    def llm_api_key(self) -> SecretStr | None: ...
    @property
    def hotel_api_key(self) -> SecretStr | None: ...
    @property
    def payment_api_key(self) -> SecretStr | None: ...


def service_secret(settings: Secrets) -> str:
    """The deployment's signing secret, or ``MissingSecretError`` saying in one line what to do."""
    value = settings.service_secret.get_secret_value() if settings.service_secret is not None else ""
    if not value.strip():
        raise MissingSecretError(
            "CONCIERGE_SERVICE_SECRET is not set: every service needs the deployment's signing secret "
            f"(at least {MIN_SECRET_CHARS} characters, e.g. `openssl rand -hex 32`); `concierge up` generates one"
        )
    if value in RETIRED_DEFAULTS:
        raise MissingSecretError(f"CONCIERGE_SERVICE_SECRET is a well-known value ({value!r}); generate your own")
    if len(value) < MIN_SECRET_CHARS:
        raise MissingSecretError(
            f"CONCIERGE_SERVICE_SECRET is too short ({len(value)} characters, at least {MIN_SECRET_CHARS}); "
            "e.g. `openssl rand -hex 32`"
        )
    return value


def admin_token(settings: Secrets) -> str | None:
    """``CONCIERGE_ADMIN_TOKEN``, or ``None`` when unset or empty (docker-compose passes an empty one through)."""
    value = settings.admin_token.get_secret_value() if settings.admin_token is not None else ""
    return value or None


LLM_KEY_PREFIX: Final = "sk-sim-"
"""What a derived model API key starts with (``llm_api_key``)."""


def llm_api_key(settings: Secrets) -> str | None:
    """The model provider's API key: ``LLM_API_KEY``, else one derived from the deployment's secret (HMAC-SHA256),
    so the simulator and the concierge agree with no key configured and the key is never a well-known value.

    ``None`` only when neither is set (the simulator then refuses every request, 401).
    """
    value = settings.llm_api_key.get_secret_value().strip() if settings.llm_api_key is not None else ""
    if value:
        return value
    try:
        secret = service_secret(settings)
    except MissingSecretError:
        return None
    digest = hmac.new(secret.encode(), b"concierge llm-api key", hashlib.sha256).hexdigest()
    return f"{LLM_KEY_PREFIX}{digest[:48]}"


# ---------------------------------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class ServiceClaims:
    """What a verified service token says."""

    issuer: str
    """The calling service."""
    audience: str
    """The called service (the verifier's own name)."""
    issued_at: int
    expires_at: int
    person: str | None = None
    """The person the caller acts for (``sub``, with ``act`` naming the caller, RFC 8693); ``None``: for itself."""


def mint_service_token(
    secret: str,
    *,
    issuer: str,
    audience: str,
    now: float | None = None,
    ttl_s: int = TOKEN_TTL_S,
    person: str | None = None,
) -> str:
    """A signed token from ``issuer`` to ``audience``, valid ``ttl_s`` from ``now``; for ``person`` when given."""
    issued = int(time.time() if now is None else now)
    claims: dict[str, Any] = {"iss": issuer, "aud": audience, "iat": issued, "exp": issued + ttl_s}
    if person is not None:
        claims["sub"] = person
        claims["act"] = {"sub": issuer}
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def verify_service_token(token: str, *, secret: str, audience: str, now: float | None = None) -> ServiceClaims:
    """The claims of ``token`` if it is ours, for ``audience``, current and short-lived; else
    ``InvalidServiceTokenError``.

    Only HS256 is accepted (never ``none``, never an algorithm the token picks for itself).
    """
    # the times are checked here, against ``now``, so a test can move the clock; PyJWT would read its own
    # ``strict_aud``: ``aud`` is exactly our name, not a list that happens to hold it
    options: Options = {"require": _REQUIRED_CLAIMS, "verify_exp": False, "verify_iat": False, "strict_aud": True}
    try:
        claims = jwt.decode(token, secret, algorithms=[ALGORITHM], audience=audience, options=options)
        _check_times(claims, time.time() if now is None else now)
    except jwt.ExpiredSignatureError:
        raise InvalidServiceTokenError("the token has expired") from None
    except jwt.InvalidAudienceError:
        raise InvalidServiceTokenError(f"the token is not for {audience}") from None
    except jwt.InvalidSignatureError:
        raise InvalidServiceTokenError("the token's signature does not match this deployment's secret") from None
    except jwt.InvalidTokenError as exc:
        raise InvalidServiceTokenError(f"not a valid service token ({type(exc).__name__})") from None
    issuer, issued, expires = claims.get("iss"), claims.get("iat"), claims.get("exp")
    if not isinstance(issuer, str) or not issuer:
        raise InvalidServiceTokenError("the token names no issuer")
    if not isinstance(issued, int) or not isinstance(expires, int):
        raise InvalidServiceTokenError("the token's times are not whole seconds")
    if expires - issued > MAX_TOKEN_LIFETIME_S:
        raise InvalidServiceTokenError(f"the token lives {expires - issued}s, more than {MAX_TOKEN_LIFETIME_S}s")
    person = claims.get("sub")
    if person is not None:
        act = claims.get("act")
        if not isinstance(person, str) or not person or not isinstance(act, dict) or act.get("sub") != issuer:
            raise InvalidServiceTokenError("a token for a person must name its caller as act.sub")
    return ServiceClaims(issuer=issuer, audience=audience, issued_at=issued, expires_at=expires, person=person)


def _check_times(claims: dict[str, Any], now: float) -> None:
    expires, issued = claims.get("exp"), claims.get("iat")
    if isinstance(expires, int | float) and now > expires + LEEWAY_S:
        raise jwt.ExpiredSignatureError
    if isinstance(issued, int | float) and issued > now + LEEWAY_S:
        raise jwt.ImmatureSignatureError


def bearer_credentials(header: str | None) -> str | None:
    """The credentials of ``Authorization: Bearer <credentials>``, or ``None`` for any other header."""
    scheme, _, credentials = (header or "").partition(" ")
    credentials = credentials.strip()
    return credentials if scheme.lower() == "bearer" and credentials else None


@dataclass
class ServiceTokens:
    """The tokens one service presents: minted once per audience, reused until ``REMINT_BEFORE_S`` is left.

    ``clock`` is injectable for tests. One instance may be shared by every client of a process.
    """

    issuer: str
    secret: str = field(repr=False)
    clock: Callable[[], float] = time.time
    capacity: int = 1024
    """Tokens kept (one per audience and person acted for); when full, all go and are minted again as needed."""
    _minted: dict[tuple[str, str | None], tuple[str, float]] = field(default_factory=dict, repr=False)

    def token(self, audience: str, person: str | None = None) -> str:
        now = self.clock()
        minted = self._minted.get((audience, person))
        if minted is not None and minted[1] - now > REMINT_BEFORE_S:
            return minted[0]
        token = mint_service_token(self.secret, issuer=self.issuer, audience=audience, now=now, person=person)
        if len(self._minted) >= self.capacity:
            self._minted.clear()
        self._minted[(audience, person)] = (token, int(now) + TOKEN_TTL_S)
        return token


_acting_for: ContextVar[str | None] = ContextVar("acting_for", default=None)


@contextlib.contextmanager
def acting_for(person: str | None) -> Iterator[None]:
    """Calls to our services inside carry ``person`` in their service token (``sub``, ``act`` = this service):
    the concierge books, reads and cancels as the chat's owner, never as itself."""
    token = _acting_for.set(person)
    try:
        yield
    finally:
        _acting_for.reset(token)


def person_acted_for() -> str | None:
    """The person ``acting_for`` names here, if any (what the service tokens minted now carry)."""
    return _acting_for.get()


class TokenVerifier:
    """``verify_service_token`` for one audience, remembering what it verified until it expires.

    A caller reuses its token for a minute, so nearly every request repeats one already checked: a dict lookup
    instead of an HMAC and a JSON parse (66 µs on these machines). At most ``capacity`` tokens are kept; when full,
    the expired ones go, then everything (a flood of distinct valid tokens costs only the verification).
    """

    def __init__(self, audience: str, *, capacity: int = 1024, clock: Callable[[], float] = time.time) -> None:
        self.audience = audience
        self._capacity = capacity
        self._clock = clock
        self._verified: dict[tuple[str, str], ServiceClaims] = {}

    def verify(self, header: str | None, secret: str) -> ServiceClaims:
        """The claims of the bearer token in ``header`` (``InvalidServiceTokenError`` when refused)."""
        token = bearer_credentials(header)
        if token is None:
            raise InvalidServiceTokenError("no bearer token")
        now = self._clock()
        entry = (secret, token)
        claims = self._verified.get(entry)
        if claims is not None and now <= claims.expires_at + LEEWAY_S:
            return claims
        claims = verify_service_token(token, secret=secret, audience=self.audience, now=now)
        if len(self._verified) >= self._capacity:
            self._verified = {k: c for k, c in self._verified.items() if now <= c.expires_at + LEEWAY_S}
            if len(self._verified) >= self._capacity:
                self._verified.clear()
        self._verified[entry] = claims
        return claims


# ---------------------------------------------------------------------------------------------------- identity

_identity: ServiceTokens | None = None


def use_service_identity(name: str, settings: Secrets) -> Restore[ServiceTokens | None]:
    """Make ``name`` this process's issuer, signing with the configured secret (``MissingSecretError`` if unusable).

    The service shell calls it when a service starts; leaving ``with use_service_identity(...):`` (or
    ``.restore()``) puts the previous identity back.
    """
    global _identity
    previous = _identity
    _identity = ServiceTokens(name, service_secret(settings))
    return Restore(previous, _restore_identity)


def _restore_identity(previous: ServiceTokens | None) -> None:
    global _identity
    _identity = previous


def service_tokens(issuer: str | None = None, settings: Secrets | None = None) -> ServiceTokens:
    """The tokens ``issuer`` presents (signed with ``settings``' secret), or this service's own when ``None``."""
    if issuer is not None:
        if settings is None:
            raise TypeError("service_tokens(issuer) signs with the deployment's secret: pass the settings")
        return ServiceTokens(issuer, service_secret(settings))
    if _identity is None:
        raise NoServiceIdentityError(
            "no service identity: call peers from a running service (create_service_app) or name the issuer"
        )
    return _identity


# ---------------------------------------------------------------------------------------------------- admin


def admin_token_ok(header: str | None, expected: str) -> bool:
    """``header`` is ``Bearer <expected>`` (constant-time comparison, whatever part is wrong)."""
    presented = bearer_credentials(header) or ""
    return hmac.compare_digest(presented.encode("utf-8", "replace"), expected.encode("utf-8"))


# ---------------------------------------------------------------------------------------------------- providers

PROVIDER_CLIENTS: Final[Mapping[str, tuple[str, ...]]] = {
    "hotel-api": ("booking-agent", "search-agent", "restaurant-agent"),
    "payment-api": ("payment-agent",),
}
"""Who each provider issues a key to. The recovery worker runs an agent's graph and presents that agent's key
(restaurant-agent: the example of docs/new-agent.md, which holds its tables at hotel-api)."""
PROVIDER_KEY_PREFIX: Final = "pk-sim-"
"""What a derived provider client key starts with (``provider_api_key``)."""
_PROVIDER_KEY_SETTINGS: Final = {"hotel-api": "hotel_api_key", "payment-api": "payment_api_key"}


def _configured_provider_key(provider: str, settings: Secrets) -> str | None:
    configured = getattr(settings, _PROVIDER_KEY_SETTINGS[provider])
    value = configured.get_secret_value().strip() if configured is not None else ""
    return value or None  # docker-compose passes an empty one through


@functools.lru_cache(maxsize=64)
def derived_provider_key(secret: str, provider: str, client: str) -> str:
    """The key ``client`` gets from ``provider`` when none is configured: HMAC-SHA256 of the deployment's secret over
    both names, so every process with the same secret agrees and no two clients (or providers) share one."""
    digest = hmac.new(secret.encode(), f"concierge {provider} key of {client}".encode(), hashlib.sha256).hexdigest()
    return f"{PROVIDER_KEY_PREFIX}{digest[:48]}"


def provider_api_key(provider: str, client: str | None, settings: Secrets) -> str | None:
    """The key ``client`` (default: this service) presents to ``provider``: ``HOTEL_API_KEY`` / ``PAYMENT_API_KEY``,
    else one derived from the deployment's secret for that client; ``None`` when there is neither."""
    configured = _configured_provider_key(provider, settings)
    if configured is not None:
        return configured
    client = client or (_identity.issuer if _identity is not None else None)
    try:
        secret = service_secret(settings)
    except MissingSecretError:
        return None
    return None if client is None else derived_provider_key(secret, provider, client)


def provider_api_key_ok(provider: str, header: str | None, settings: Secrets) -> bool:
    """``header`` is ``Bearer <key>`` of one of ``provider``'s clients (constant time, every key compared)."""
    configured = _configured_provider_key(provider, settings)
    if configured is not None:
        accepted = [configured]
    else:
        try:
            secret = service_secret(settings)
        except MissingSecretError:
            return False  # no key can be known: nobody is let in
        accepted = [derived_provider_key(secret, provider, client) for client in PROVIDER_CLIENTS[provider]]
    presented = (bearer_credentials(header) or "").encode("utf-8", "replace")
    matches = [hmac.compare_digest(presented, key.encode("utf-8")) for key in accepted]
    return bool(presented) and any(matches)
