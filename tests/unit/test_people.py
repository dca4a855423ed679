"""A person's bearer token, checked as RFC 8725 asks: every way a token can be wrong is refused with its reason, and
the issuer's keys are fetched again on an unknown kid at most every 30 s (a fake clock, never a wall-clock wait)."""

from __future__ import annotations

import base64
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jwt
import pytest

from identity.people import (
    REFETCH_INTERVAL_S,
    InvalidPersonTokenError,
    JwksSource,
    JwksUnavailableError,
    LocalIssuer,
    Person,
    PersonVerifier,
    UnauthenticatedError,
    www_authenticate,
)

ISSUER = "https://issuer.test"


@pytest.fixture
def issuer(tmp_path: Path) -> LocalIssuer:
    return LocalIssuer(tmp_path / "issuer", ISSUER)


@pytest.fixture
def verifier(issuer: LocalIssuer) -> PersonVerifier:
    return PersonVerifier(issuer=ISSUER, audience="concierge", jwks=JwksSource(path=issuer.jwks_path))


async def refused(verifier: PersonVerifier, token: str) -> str:
    with pytest.raises(InvalidPersonTokenError) as caught:
        await verifier.verify(token)
    assert token not in caught.value.reason
    return caught.value.reason


def b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


async def test_a_good_token_is_its_person(issuer: LocalIssuer, verifier: PersonVerifier) -> None:
    assert await verifier.verify(issuer.mint("ana")) == Person("ana")
    assert await verifier.verify(issuer.mint("ana", actor="concierge-agent")) == Person("ana", "concierge-agent")
    # aud may be a list containing ours
    token = jwt.encode(
        {"iss": ISSUER, "sub": "bo", "aud": ["other", "concierge"], "exp": 2**40},
        issuer._private,
        algorithm="ES256",
        headers={"kid": issuer.kid},
    )
    assert (await verifier.verify(token)).sub == "bo"


async def test_the_issuer_is_made_once_and_reused(tmp_path: Path) -> None:
    first = LocalIssuer(tmp_path / "i", ISSUER)
    again = LocalIssuer(tmp_path / "i", ISSUER)
    assert first.kid == again.kid and first.public_jwk == again.public_jwk
    assert (tmp_path / "i" / LocalIssuer.KEY_FILE).stat().st_mode & 0o077 == 0
    verifier = PersonVerifier(issuer=ISSUER, audience="concierge", jwks=JwksSource(path=first.jwks_path))
    assert (await verifier.verify(again.mint("ana"))).sub == "ana"


async def test_no_token_is_unauthenticated(verifier: PersonVerifier) -> None:
    for token in (None, ""):
        with pytest.raises(UnauthenticatedError) as caught:
            await verifier.verify(token)
        assert www_authenticate(caught.value) == "Bearer"


async def test_every_bad_token_is_refused_with_its_reason(
    issuer: LocalIssuer, verifier: PersonVerifier, tmp_path: Path
) -> None:
    assert "exp" in await refused(verifier, issuer.mint("ana", ttl_s=10, now=1_000_000))
    assert "aud" in await refused(verifier, issuer.mint("ana", audience="elsewhere"))
    stranger = LocalIssuer(tmp_path / "stranger", "https://stranger.test")
    assert "key id" in await refused(verifier, stranger.mint("ana"))  # its kid is not our issuer's
    # the stranger signs with our kid: the signature fails
    forged = jwt.encode(
        {"iss": ISSUER, "sub": "ana", "aud": "concierge", "exp": 2**40},
        stranger._private,
        algorithm="ES256",
        headers={"kid": issuer.kid},
    )
    assert "signature" in await refused(verifier, forged)
    other_iss = jwt.encode(
        {"iss": "https://evil.test", "sub": "ana", "aud": "concierge", "exp": 2**40},
        issuer._private,
        algorithm="ES256",
        headers={"kid": issuer.kid},
    )
    assert "iss" in await refused(verifier, other_iss)
    no_exp = jwt.encode(
        {"iss": ISSUER, "sub": "ana", "aud": "concierge"},
        issuer._private,
        algorithm="ES256",
        headers={"kid": issuer.kid},
    )
    assert "exp" in await refused(verifier, no_exp)
    no_sub = jwt.encode(
        {"iss": ISSUER, "aud": "concierge", "exp": 2**40},
        issuer._private,
        algorithm="ES256",
        headers={"kid": issuer.kid},
    )
    assert "sub" in await refused(verifier, no_sub)
    # alg none and HS256 (keyed with public material, the classic confusion) never reach a key
    claims = {"iss": ISSUER, "sub": "ana", "aud": "concierge", "exp": 2**40}
    unsigned = f"{b64({'alg': 'none', 'typ': 'JWT', 'kid': issuer.kid})}.{b64(claims)}."
    assert "algorithm" in await refused(verifier, unsigned)
    hs = jwt.encode(claims, str(issuer.public_jwk["x"]) * 2, algorithm="HS256", headers={"kid": issuer.kid})
    assert "algorithm" in await refused(verifier, hs)
    no_kid = jwt.encode(claims, issuer._private, algorithm="ES256")
    assert "kid" in await refused(verifier, no_kid)
    for garbage in ("garbage", "a.b.c", "Bearer x"):
        assert await refused(verifier, garbage)


async def test_an_expired_token_within_the_leeway_is_still_good(issuer: LocalIssuer, verifier: PersonVerifier) -> None:
    import time

    assert (await verifier.verify(issuer.mint("ana", ttl_s=1, now=time.time() - 30))).sub == "ana"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def jwks_server(issuer: LocalIssuer) -> Iterator[tuple[str, list[int]]]:
    """The issuer's JWKS over HTTP on 127.0.0.1 (a real server), counting the GETs; serves ``jwks.json`` as it is now."""
    hits: list[int] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(1)
            body = issuer.jwks_path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks", hits
    finally:
        server.shutdown()
        server.server_close()


async def test_the_jwks_url_is_fetched_once_and_again_on_an_unknown_kid_at_most_every_30_s(
    issuer: LocalIssuer, jwks_server: tuple[str, list[int]], tmp_path: Path
) -> None:
    url, hits = jwks_server
    clock = FakeClock()
    verifier = PersonVerifier(issuer=ISSUER, audience="concierge", jwks=JwksSource(url=url, clock=clock))
    for _ in range(5):
        assert (await verifier.verify(issuer.mint("ana"))).sub == "ana"
    assert len(hits) == 1  # cached

    # the issuer rotates: a new key is added to its JWKS; a token with the new kid makes one fetch
    rotated = LocalIssuer(tmp_path / "rotated", ISSUER)
    keys = json.loads(issuer.jwks_path.read_text())["keys"] + json.loads(rotated.jwks_path.read_text())["keys"]
    issuer.jwks_path.write_text(json.dumps({"keys": keys}))
    clock.now += REFETCH_INTERVAL_S
    assert (await verifier.verify(rotated.mint("ana"))).sub == "ana"
    assert len(hits) == 2

    # made-up kids: refused, and no more fetches until 30 s have passed
    made_up = jwt.encode(
        {"iss": ISSUER, "sub": "ana", "aud": "concierge", "exp": 2**40},
        issuer._private,
        algorithm="ES256",
        headers={"kid": "nope"},
    )
    for _ in range(20):
        with pytest.raises(InvalidPersonTokenError):
            await verifier.verify(made_up)
    assert len(hits) == 2
    clock.now += REFETCH_INTERVAL_S
    with pytest.raises(InvalidPersonTokenError):
        await verifier.verify(made_up)
    assert len(hits) == 3


async def test_keys_that_cannot_be_read_are_unavailable_not_a_bad_token(tmp_path: Path) -> None:
    verifier = PersonVerifier(issuer=ISSUER, audience="concierge", jwks=JwksSource(path=tmp_path / "missing.json"))
    issuer = LocalIssuer(tmp_path / "i", ISSUER)
    with pytest.raises(JwksUnavailableError):
        await verifier.verify(issuer.mint("ana"))
    (tmp_path / "missing.json").write_text("not json")
    verifier = PersonVerifier(issuer=ISSUER, audience="concierge", jwks=JwksSource(path=tmp_path / "missing.json"))
    with pytest.raises(JwksUnavailableError):
        await verifier.verify(issuer.mint("ana"))
    closed = PersonVerifier(issuer=ISSUER, audience="concierge", jwks=JwksSource(url="http://127.0.0.1:9/jwks"))
    with pytest.raises(JwksUnavailableError):
        await closed.verify(issuer.mint("ana"))


def test_a_source_is_a_url_or_a_file() -> None:
    with pytest.raises(ValueError):
        JwksSource()
    with pytest.raises(ValueError):
        JwksSource(url="http://127.0.0.1/jwks", path="/tmp/jwks.json")


def test_an_empty_issuer_setting_is_an_unset_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """docker-compose.yml passes ${CONCIERGE_AUTH_JWKS_URL:-} (empty unless set) and a real provider empties
    CONCIERGE_AUTH_JWKS_FILE: empty is unset, not a validation error nor the path "."."""
    from identity.people import PeopleConfigError, PeopleGate
    from infra.settings import Settings

    monkeypatch.delenv("CONCIERGE_AUTH", raising=False)
    monkeypatch.setenv("CONCIERGE_AUTH_ISSUER", ISSUER)
    monkeypatch.setenv("CONCIERGE_AUTH_JWKS_URL", "")
    monkeypatch.setenv("CONCIERGE_AUTH_JWKS_FILE", str(tmp_path / "jwks.json"))
    settings = Settings()
    assert settings.auth_jwks_url is None
    gate = PeopleGate.from_settings(settings)
    assert gate.verifier is not None and gate.verifier.jwks.path == tmp_path / "jwks.json"

    monkeypatch.setenv("CONCIERGE_AUTH_JWKS_URL", "https://issuer.test/jwks")
    monkeypatch.setenv("CONCIERGE_AUTH_JWKS_FILE", "")
    settings = Settings()
    assert settings.auth_jwks_file is None
    gate = PeopleGate.from_settings(settings)
    assert gate.verifier is not None and gate.verifier.jwks.url == "https://issuer.test/jwks"

    monkeypatch.setenv("CONCIERGE_AUTH_ISSUER", " ")
    with pytest.raises(PeopleConfigError):
        PeopleGate.from_settings(Settings())


async def test_a_verified_token_is_remembered_until_it_expires_and_no_longer(
    issuer: LocalIssuer, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1_000_000.0]
    verifier = PersonVerifier(
        issuer=ISSUER, audience="concierge", jwks=JwksSource(path=issuer.jwks_path), clock=lambda: now[0]
    )
    token = issuer.mint("ana", now=now[0], ttl_s=60)
    checks = []
    original = verifier._check

    async def counted(presented: str) -> tuple[Person, float]:
        checks.append(presented)
        return await original(presented)

    monkeypatch.setattr(verifier, "_check", counted)
    monkeypatch.setattr(jwt.api_jwt, "datetime", _FrozenDatetime(now))  # PyJWT reads the time itself
    assert await verifier.verify(token) == Person("ana")
    assert await verifier.verify(token) == Person("ana")
    assert len(checks) == 1  # the second request cost a lookup, not a signature check
    now[0] += 60 + 61  # past exp and the leeway: checked again, and refused
    with pytest.raises(InvalidPersonTokenError, match="exp"):
        await verifier.verify(token)
    assert len(checks) == 2


class _FrozenDatetime:
    """``datetime`` for PyJWT with ``now`` from the test's clock."""

    def __init__(self, now: list[float]) -> None:
        self._now = now

    def now(self, tz: Any = None) -> Any:
        import datetime as dt

        return dt.datetime.fromtimestamp(self._now[0], tz=dt.UTC)

    def __getattr__(self, name: str) -> Any:
        import datetime as dt

        return getattr(dt.datetime, name)


async def test_a_token_made_to_live_longer_than_the_max_age_or_grown_older_is_refused(
    issuer: LocalIssuer, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [2_000_000.0]
    verifier = PersonVerifier(
        issuer=ISSUER,
        audience="concierge",
        jwks=JwksSource(path=issuer.jwks_path),
        clock=lambda: now[0],
        max_age_s=86_400,
    )
    monkeypatch.setattr(jwt.api_jwt, "datetime", _FrozenDatetime(now))
    century = issuer.mint("ana", now=now[0], ttl_s=100 * 365 * 86_400)
    with pytest.raises(InvalidPersonTokenError, match=r"exp: more than 86400 s after iat"):
        await verifier.verify(century)
    day = issuer.mint("ana", now=now[0], ttl_s=86_400)
    assert await verifier.verify(day) == Person("ana")
    # signed without iat, whatever its exp: refused once a max age is set
    no_iat = jwt.encode(
        {"iss": ISSUER, "sub": "ana", "aud": "concierge", "exp": int(now[0]) + 60},
        issuer._private,
        algorithm="ES256",
        headers={"kid": issuer.kid},
    )
    with pytest.raises(InvalidPersonTokenError, match="iat: missing"):
        await verifier.verify(no_iat)
    # issued long ago with an exp still ahead (a clock-skewed issuer): too old, whatever exp says
    stale = jwt.encode(
        {"iss": ISSUER, "sub": "ana", "aud": "concierge", "iat": int(now[0]) - 90_000, "exp": int(now[0]) + 60},
        issuer._private,
        algorithm="ES256",
        headers={"kid": issuer.kid},
    )
    with pytest.raises(InvalidPersonTokenError, match=r"exp: more than|iat: older than"):
        await verifier.verify(stale)
