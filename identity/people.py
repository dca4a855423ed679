"""Who the person is: a bearer JWT from a trusted OIDC issuer, checked as RFC 8725 asks.

Asymmetric algorithms only (``ALGORITHMS``: never ``none`` or HS256, whatever the token's header says), ``iss`` equal
to the configured issuer, ``aud`` containing the audience, ``exp`` required (``LEEWAY_S`` of clock skew), and the key
chosen by ``kid`` from the issuer's JWKS: any OIDC provider's ``jwks_uri`` (Keycloak, Auth0, Dex), fetched once and
fetched again on an unknown ``kid`` at most every ``REFETCH_INTERVAL_S``, or a file. ``sub`` is the person; ``act``
(RFC 8693) names a service acting for them. ``LocalIssuer`` is a machine's own issuer: a key pair and its JWKS file
in a directory, for ``concierge up`` and the tests. ``PeopleGate`` turns a request's ``Authorization`` into its
``Caller``: a person, the operator (the admin token: sees everyone's), or ``anonymous`` with ``CONCIERGE_AUTH=off``.

::

    PeopleError (identity.auth.IdentityError)
     ├── PersonAuthError
     │    ├── UnauthenticatedError     no bearer token: 401 ``unauthenticated``, ``WWW-Authenticate: Bearer``
     │    ├── InvalidPersonTokenError  a token was refused (.reason, never the token): 401, ``error="invalid_token"``
     │    └── JwksUnavailableError     the issuer's keys could not be read (their URL or file): 503, try again
     ├── QuotaExceededError           a person used their share: 429 ``quota_exceeded``, ``Retry-After``
     ├── IdempotencyKeyReusedError    the person's key came before with another body: 422 ``idempotency_key_reused``
     └── PeopleConfigError            auth is on and no issuer is configured: the service does not start
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

import jwt

from identity.auth import IdentityError, admin_token_ok, bearer_credentials

if TYPE_CHECKING:
    from pydantic import SecretStr

__all__ = [
    "ALGORITHMS",
    "ANONYMOUS",
    "LEEWAY_S",
    "LOCAL_ISSUER",
    "OPERATOR",
    "REFETCH_INTERVAL_S",
    "Caller",
    "GateSettings",
    "IdempotencyKeyReusedError",
    "InvalidPersonTokenError",
    "JwksSource",
    "JwksUnavailableError",
    "LocalIssuer",
    "PeopleConfigError",
    "PeopleError",
    "PeopleGate",
    "Person",
    "PersonAuthError",
    "PersonVerifier",
    "QuotaExceededError",
    "UnauthenticatedError",
    "person_key",
    "www_authenticate",
]

ALGORITHMS: Final = ("RS256", "ES256", "EdDSA")
"""The only algorithms a person's token may use: a public key can verify them and cannot mint them."""
LEEWAY_S: Final = 60
"""Clock skew tolerated on ``exp`` (and ``nbf``, ``iat``) between the issuer and us."""
REFETCH_INTERVAL_S: Final = 30.0
"""An unknown ``kid`` fetches the JWKS again at most this often: a flood of made-up kids costs one fetch each 30 s."""
JWKS_FETCH_TIMEOUT_S: Final = 5.0
MAX_JWKS_BYTES: Final = 1_000_000
ANONYMOUS: Final = "anonymous"
"""The person every request is with ``CONCIERGE_AUTH=off`` (tests and experiments only)."""
OPERATOR: Final = "operator"
"""Who presents the admin token: the operator, who sees and may act on every person's bookings and chats."""
LOCAL_ISSUER: Final = "concierge-local"
"""The ``iss`` of a machine's own issuer (``LocalIssuer``, made by ``concierge up``)."""
_REQUIRED_CLAIMS: Final = ["exp", "iss", "aud", "sub"]
logger = logging.getLogger(__name__)


class PeopleError(IdentityError):
    """Who is calling, and what they may still do."""


class PersonAuthError(PeopleError):
    """A person's credential is missing, refused, or cannot be checked now."""


class UnauthenticatedError(PersonAuthError):
    """No ``Authorization: Bearer`` token at all."""


class InvalidPersonTokenError(PersonAuthError):
    """A presented token was refused; ``reason`` says why for the log and the answer (never the token itself)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class JwksUnavailableError(PersonAuthError):
    """The issuer's keys could not be fetched or read: nobody's token can be checked now (503, not 401)."""


class QuotaExceededError(PeopleError):
    """A person's share is used up for now (``quota`` names which); ``retry_after`` seconds until it frees."""

    def __init__(self, quota: str, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.quota = quota
        self.retry_after = retry_after


class IdempotencyKeyReusedError(PeopleError):
    """The caller's ``Idempotency-Key`` was used before with a different body (keys are per person)."""


class PeopleConfigError(PeopleError):
    """``CONCIERGE_AUTH`` is on and no issuer (or none of its keys) is configured."""


def www_authenticate(exc: PersonAuthError) -> str:
    """The ``WWW-Authenticate`` header of a 401 (RFC 6750 section 3): no error code when no token was sent."""
    if isinstance(exc, InvalidPersonTokenError):
        return 'Bearer error="invalid_token"'
    return "Bearer"


@dataclass(frozen=True)
class Person:
    """Who a request is for: ``sub``, and ``actor`` when a service (RFC 8693 ``act``) acts on their behalf."""

    sub: str
    actor: str | None = None


class JwksSource:
    """The issuer's public keys by ``kid``, from ``url`` or ``path``: read once, again on an unknown ``kid`` at most
    every ``REFETCH_INTERVAL_S`` (``clock`` is injectable for tests)."""

    def __init__(
        self, *, url: str | None = None, path: str | Path | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if (url is None) == (path is None):
            raise ValueError("a JWKS source is a URL or a file, exactly one")
        self.url = url
        self.path = Path(path) if path is not None else None
        self._clock = clock
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()
        self.fetches = 0

    async def key(self, kid: str) -> jwt.PyJWK:
        """The key named ``kid`` (``InvalidPersonTokenError`` when the issuer has none by that name)."""
        found = self._keys.get(kid)
        if found is not None:
            return found
        async with self._lock:
            found = self._keys.get(kid)
            due = self._fetched_at is None or self._clock() - self._fetched_at >= REFETCH_INTERVAL_S
            if found is None and due:
                self._keys = await self._load()
                self._fetched_at = self._clock()
                found = self._keys.get(kid)
        if found is None:
            raise InvalidPersonTokenError(f"unknown key id {kid[:64]!r}")
        return found

    async def _load(self) -> dict[str, jwt.PyJWK]:
        self.fetches += 1
        try:
            raw = await (self._fetch() if self.url is not None else asyncio.to_thread(self._read))
            document = json.loads(raw)
            keys = document.get("keys") if isinstance(document, dict) else None
            if not isinstance(keys, list):
                raise ValueError("no 'keys' list")
        except (OSError, ValueError) as exc:
            raise JwksUnavailableError(f"the issuer's keys could not be read: {exc}") from exc
        loaded: dict[str, jwt.PyJWK] = {}
        for entry in keys:
            if not isinstance(entry, dict) or not isinstance(entry.get("kid"), str) or entry.get("use") == "enc":
                continue
            try:
                loaded[entry["kid"]] = jwt.PyJWK(entry)
            except jwt.PyJWTError:
                continue  # a key type or algorithm we do not take: tokens signed with it are refused
        return loaded

    def _read(self) -> bytes:
        assert self.path is not None
        with self.path.open("rb") as file:
            return file.read(MAX_JWKS_BYTES + 1)[:MAX_JWKS_BYTES]

    async def _fetch(self) -> bytes:
        import httpx

        assert self.url is not None
        try:
            async with httpx.AsyncClient(timeout=JWKS_FETCH_TIMEOUT_S) as client:
                response = await client.get(self.url, headers={"Accept": "application/json"})
                response.raise_for_status()
        except httpx.HTTPError as exc:
            raise OSError(f"GET {self.url}: {exc}") from exc
        return response.content[:MAX_JWKS_BYTES]


class PersonVerifier:
    """The person a bearer token is for, checked against one issuer, one audience and the issuer's keys.

    A client reuses its token for many requests, so a verified one is remembered until it expires (at most
    ``capacity``; when full, the expired go, then everything): a dict lookup instead of an ECDSA check (about a
    millisecond here). Only tokens that verified are kept; a refused one is checked again each time.
    """

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        jwks: JwksSource,
        capacity: int = 10_000,
        clock: Callable[[], float] = time.time,
        max_age_s: float | None = None,
    ) -> None:
        self.issuer = issuer
        self.max_age_s = max_age_s
        """``iat`` required, and no token older than this or made to live longer (``CONCIERGE_AUTH_MAX_TOKEN_AGE_S``)."""
        self.audience = audience
        self.jwks = jwks
        self._capacity = capacity
        self._clock = clock
        self._verified: dict[str, tuple[Person, float]] = {}

    async def verify(self, token: str | None) -> Person:
        """The token's person, or ``UnauthenticatedError`` (none), ``InvalidPersonTokenError`` (refused),
        ``JwksUnavailableError`` (the keys cannot be read now)."""
        if not token:
            raise UnauthenticatedError("no bearer token")
        now = self._clock()
        known = self._verified.get(token)
        if known is not None and now <= known[1] + LEEWAY_S:
            return known[0]
        person, expires = await self._check(token)
        if len(self._verified) >= self._capacity:
            self._verified = {t: v for t, v in self._verified.items() if now <= v[1] + LEEWAY_S}
            if len(self._verified) >= self._capacity:
                self._verified.clear()
        self._verified[token] = (person, expires)
        return person

    async def _check(self, token: str) -> tuple[Person, float]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise InvalidPersonTokenError("not a JWT") from exc
        algorithm = header.get("alg")
        if algorithm not in ALGORITHMS:
            raise InvalidPersonTokenError(f"algorithm {str(algorithm)[:16]!r} is not one of {', '.join(ALGORITHMS)}")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise InvalidPersonTokenError("no key id (kid)")
        key = await self.jwks.key(kid)
        if key.algorithm_name != algorithm:
            raise InvalidPersonTokenError(f"key {kid[:64]!r} is not a {algorithm} key")
        try:
            claims = jwt.decode(
                token,
                key.key,
                algorithms=[algorithm],
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": _REQUIRED_CLAIMS},
            )
        except jwt.PyJWTError as exc:
            raise InvalidPersonTokenError(_reason(exc)) from exc
        if self.max_age_s is not None:
            self._check_age(claims)
        return _person(claims), float(claims["exp"])

    def _check_age(self, claims: Mapping[str, Any]) -> None:
        """A token is good for ``max_age_s`` from when it was issued, at most, whatever ``exp`` it was given."""
        assert self.max_age_s is not None
        issued, expires = claims.get("iat"), claims.get("exp")
        if not isinstance(issued, int | float) or isinstance(issued, bool):
            raise InvalidPersonTokenError("iat: missing")
        limit, setting = f"{self.max_age_s:g} s", "(CONCIERGE_AUTH_MAX_TOKEN_AGE_S)"
        if self._clock() - float(issued) > self.max_age_s + LEEWAY_S:
            raise InvalidPersonTokenError(f"iat: older than {limit} {setting}")
        if float(expires) - float(issued) > self.max_age_s:  # type: ignore[arg-type]
            raise InvalidPersonTokenError(f"exp: more than {limit} after iat {setting}")


def _person(claims: Mapping[str, Any]) -> Person:
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub.strip() or len(sub) > 255:
        raise InvalidPersonTokenError("sub: not a person's id")
    act = claims.get("act")
    actor = act.get("sub") if isinstance(act, dict) else None
    if act is not None and not isinstance(actor, str):
        raise InvalidPersonTokenError("act: no sub")
    return Person(sub=sub, actor=actor)


def _reason(exc: jwt.PyJWTError) -> str:
    """One line for the 401's log and body: what was wrong, in the claim's name."""
    if isinstance(exc, jwt.ExpiredSignatureError):
        return "exp: expired"
    if isinstance(exc, jwt.InvalidIssuerError):
        return "iss: not the trusted issuer"
    if isinstance(exc, jwt.InvalidAudienceError):
        return "aud: not for this service"
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"{exc.claim}: missing"
    if isinstance(exc, jwt.InvalidSignatureError):
        return "signature: does not verify"
    if isinstance(exc, jwt.ImmatureSignatureError):
        return "nbf/iat: not yet valid"
    return "malformed token"


class LocalIssuer:
    """A machine's own issuer: an ES256 key pair in ``directory`` (the private key 0600) and its JWKS file, made
    once and reused, so every service started from that directory trusts the tokens ``mint`` makes."""

    KEY_FILE: Final = "issuer-key.pem"
    JWKS_FILE: Final = "jwks.json"

    def __init__(self, directory: str | Path, issuer: str) -> None:
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        self.directory = Path(directory)
        self.issuer = issuer
        key_path = self.directory / self.KEY_FILE
        if not key_path.exists():
            self._create(key_path)
        private = load_pem_private_key(key_path.read_bytes(), password=None)
        if not isinstance(private, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{key_path}: not an EC private key")
        self._private = private
        public_jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(private.public_key()))
        self.kid = str(json.loads((self.directory / self.JWKS_FILE).read_text())["keys"][0]["kid"])
        self.public_jwk = {**public_jwk, "kid": self.kid, "alg": "ES256", "use": "sig"}

    @property
    def jwks_path(self) -> Path:
        return self.directory / self.JWKS_FILE

    def _create(self, key_path: Path) -> None:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        self.directory.mkdir(parents=True, exist_ok=True)
        private = ec.generate_private_key(ec.SECP256R1())
        pem = private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(pem)
        public = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(private.public_key()))
        jwks = {"keys": [{**public, "kid": uuid.uuid4().hex[:16], "alg": "ES256", "use": "sig"}]}
        (self.directory / self.JWKS_FILE).write_text(json.dumps(jwks, indent=2) + "\n")

    def mint(
        self,
        sub: str,
        *,
        audience: str = "concierge",
        ttl_s: float = 3600.0,
        actor: str | None = None,
        now: float | None = None,
    ) -> str:
        """A token for person ``sub`` (``actor``: the service acting for them, as its ``act`` claim)."""
        issued = int(time.time() if now is None else now)
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": sub,
            "aud": audience,
            "iat": issued,
            "exp": issued + int(ttl_s),
        }
        if actor is not None:
            claims["act"] = {"sub": actor}
        return jwt.encode(claims, self._private, algorithm="ES256", headers={"kid": self.kid})


@dataclass(frozen=True)
class Caller:
    """Who a public request is from: a person, or the operator (the admin token), who sees every person's."""

    person: str
    operator: bool = False
    """Sees every person's records: the admin token's holder, or anyone with ``CONCIERGE_AUTH=off``."""

    def may_see(self, owner: str | None) -> bool:
        """Whether a record ``owner`` made is this caller's to see (another person's answers 404, as unknown)."""
        return self.operator or (owner is not None and owner == self.person)

    @property
    def scope(self) -> str | None:
        """Whose records a list shows: this person's, or ``None`` (everyone's) for the operator."""
        return None if self.operator else self.person


class PeopleGate:
    """The caller of a public request, from its ``Authorization`` header: the operator's admin token, a person's
    JWT (``PersonVerifier``), or with auth off, ``anonymous`` whatever is sent."""

    def __init__(self, verifier: PersonVerifier | None, admin_token: str | None) -> None:
        self.verifier = verifier
        self._admin = admin_token

    @property
    def enabled(self) -> bool:
        return self.verifier is not None

    async def caller(self, authorization: str | None) -> Caller:
        """``Caller`` for the header, or a ``PersonAuthError`` (401, or 503 when the issuer's keys are unreadable)."""
        if self.verifier is None:  # identities off: nobody to tell apart, so every caller sees every record
            return Caller(ANONYMOUS, operator=True)
        if self._admin is not None and admin_token_ok(authorization, self._admin):
            return Caller(OPERATOR, operator=True)
        token = bearer_credentials(authorization)
        if authorization is not None and token is None:
            raise InvalidPersonTokenError("not a Bearer credential")
        person = await self.verifier.verify(token)
        return Caller(person.sub)

    @classmethod
    def from_settings(cls, settings: GateSettings) -> PeopleGate:
        """The gate the settings describe (``PeopleConfigError`` when auth is on and no issuer is configured)."""
        admin = settings.admin_token.get_secret_value() if settings.admin_token is not None else None
        if settings.auth == "off":
            logger.warning(
                "CONCIERGE_AUTH=off: every request is the person %r, whoever sends it (tests and experiments only)",
                ANONYMOUS,
            )
            return cls(None, admin)
        if not settings.auth_issuer or (settings.auth_jwks_url is None) == (settings.auth_jwks_file is None):
            raise PeopleConfigError(
                "people's tokens cannot be checked: set CONCIERGE_AUTH_ISSUER and one of CONCIERGE_AUTH_JWKS_URL or "
                "CONCIERGE_AUTH_JWKS_FILE (docs/deploy.md; `concierge up` makes a local issuer), or CONCIERGE_AUTH=off "
                "for tests"
            )
        jwks = JwksSource(url=settings.auth_jwks_url, path=settings.auth_jwks_file)
        verifier = PersonVerifier(
            issuer=settings.auth_issuer,
            audience=settings.auth_audience,
            jwks=jwks,
            max_age_s=settings.auth_max_token_age_s,
        )
        return cls(verifier, admin)


class GateSettings(Protocol):
    """What ``PeopleGate.from_settings`` reads (``infra.settings.Settings`` is one): identity sits below infra."""

    @property
    def admin_token(self) -> SecretStr | None: ...
    @property
    def auth(self) -> Literal["on", "off"]: ...
    @property
    def auth_issuer(self) -> str | None: ...
    @property
    def auth_audience(self) -> str: ...
    @property
    def auth_jwks_url(self) -> str | None: ...
    @property
    def auth_jwks_file(self) -> Path | None: ...
    @property
    def auth_max_token_age_s(self) -> float: ...


def person_key(person: str) -> str:
    """A person's id as a Redis key part: fixed length, whatever characters their ``sub`` holds."""
    return hashlib.sha256(person.encode()).hexdigest()[:32]
