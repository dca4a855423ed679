"""identity.auth: service tokens (mint, verify, reuse), the deployment secret, the admin token and the providers'
client keys."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import jwt
import pytest

from identity.auth import (
    LEEWAY_S,
    MAX_TOKEN_LIFETIME_S,
    PROVIDER_CLIENTS,
    PROVIDER_KEY_PREFIX,
    REMINT_BEFORE_S,
    TOKEN_TTL_S,
    InvalidServiceTokenError,
    MissingSecretError,
    NoServiceIdentityError,
    ServiceTokens,
    TokenVerifier,
    admin_token,
    admin_token_ok,
    bearer_credentials,
    derived_provider_key,
    llm_api_key,
    mint_service_token,
    provider_api_key,
    provider_api_key_ok,
    service_secret,
    service_tokens,
    use_service_identity,
    verify_service_token,
)
from infra.settings import Settings, get_settings

SECRET = "unit-test-secret-" + "0123456789abcdef" * 2
NOW = 1_900_000_000.0


def mint(*, secret: str = SECRET, **overrides: Any) -> str:
    fields: dict[str, Any] = {"issuer": "booking-agent", "audience": "payment-agent", "now": NOW}
    fields.update(overrides)
    return mint_service_token(secret, **fields)


def verify(token: str, *, audience: str = "payment-agent", secret: str = SECRET, now: float = NOW) -> Any:
    return verify_service_token(token, secret=secret, audience=audience, now=now)


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    monkeypatch.setenv("CONCIERGE_SERVICE_SECRET", SECRET)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


# ---------------------------------------------------------------------------------------------- mint and verify


def test_a_token_names_caller_and_callee_and_lives_a_minute() -> None:
    token = mint()
    claims = verify(token)
    assert (claims.issuer, claims.audience) == ("booking-agent", "payment-agent")
    assert claims.issued_at == int(NOW) and claims.expires_at == int(NOW) + TOKEN_TTL_S
    header = jwt.get_unverified_header(token)
    assert header["alg"] == "HS256"
    assert set(jwt.decode(token, options={"verify_signature": False})) == {"iss", "aud", "iat", "exp"}


def test_an_expired_token_is_refused_after_the_leeway() -> None:
    token = mint()
    assert verify(token, now=NOW + TOKEN_TTL_S + LEEWAY_S)  # clock skew between two hosts is tolerated
    with pytest.raises(InvalidServiceTokenError, match="expired"):
        verify(token, now=NOW + TOKEN_TTL_S + LEEWAY_S + 1)


def test_a_token_from_the_future_is_refused() -> None:
    with pytest.raises(InvalidServiceTokenError):
        verify(mint(now=NOW + 3600))


def test_a_token_for_another_service_is_refused() -> None:
    with pytest.raises(InvalidServiceTokenError, match="not for search-agent"):
        verify(mint(), audience="search-agent")


def test_a_token_for_several_services_is_refused() -> None:
    claims = {"iss": "booking-agent", "aud": ["search-agent", "payment-agent"], "iat": int(NOW), "exp": int(NOW) + 60}
    with pytest.raises(InvalidServiceTokenError):
        verify(jwt.encode(claims, SECRET, algorithm="HS256"))


def test_a_token_signed_with_another_secret_is_refused() -> None:
    with pytest.raises(InvalidServiceTokenError, match="signature"):
        verify(mint(secret="another-deployment-secret-" + "x" * 32))


@pytest.mark.parametrize("algorithm", ["none", "HS512"])
def test_only_hs256_is_accepted(algorithm: str) -> None:
    claims = {"iss": "booking-agent", "aud": "payment-agent", "iat": int(NOW), "exp": int(NOW) + 60}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jwt.InsecureKeyLengthWarning)  # HS512 wants 64 bytes; beside the point
        token = jwt.encode(claims, None if algorithm == "none" else SECRET, algorithm=algorithm)
    with pytest.raises(InvalidServiceTokenError, match="InvalidAlgorithmError"):  # our secret, the wrong algorithm
        verify(token)


@pytest.mark.parametrize("missing", ["iss", "aud", "iat", "exp"])
def test_every_claim_is_required(missing: str) -> None:
    claims = {"iss": "booking-agent", "aud": "payment-agent", "iat": int(NOW), "exp": int(NOW) + 60}
    del claims[missing]
    with pytest.raises(InvalidServiceTokenError):
        verify(jwt.encode(claims, SECRET, algorithm="HS256"))


def test_a_long_lived_token_is_refused_even_when_signed() -> None:
    with pytest.raises(InvalidServiceTokenError, match="lives"):
        verify(mint(ttl_s=MAX_TOKEN_LIFETIME_S + 1))


@pytest.mark.parametrize("garbage", ["", "concierge-dev-token", SECRET, "a.b.c", "Bearer x"])
def test_what_is_not_a_token_is_refused(garbage: str) -> None:
    with pytest.raises(InvalidServiceTokenError):
        verify(garbage)


def test_bearer_credentials() -> None:
    assert bearer_credentials("Bearer abc") == "abc"
    assert bearer_credentials("bearer  abc ") == "abc"
    assert bearer_credentials("Basic abc") is None
    assert bearer_credentials("abc") is None
    assert bearer_credentials("Bearer ") is None
    assert bearer_credentials(None) is None


# ---------------------------------------------------------------------------------------------- reuse


def test_a_caller_mints_once_per_audience_and_renews_before_expiry() -> None:
    clock = Clock()
    tokens = ServiceTokens("booking-agent", SECRET, clock=clock)
    first = tokens.token("payment-agent")
    assert tokens.token("payment-agent") == first  # reused: no signing per request
    assert tokens.token("search-agent") != first
    clock.now += TOKEN_TTL_S - REMINT_BEFORE_S - 1
    assert tokens.token("payment-agent") == first
    clock.now += 2
    renewed = tokens.token("payment-agent")
    assert renewed != first
    assert verify(renewed, now=clock.now).expires_at == int(clock.now) + TOKEN_TTL_S


def test_the_verifier_remembers_tokens_until_they_expire() -> None:
    clock = Clock()
    verifier = TokenVerifier("payment-agent", clock=clock)
    header = f"Bearer {mint()}"
    assert verifier.verify(header, SECRET).issuer == "booking-agent"
    assert verifier.verify(header, SECRET).issuer == "booking-agent"  # from memory
    with pytest.raises(InvalidServiceTokenError):
        verifier.verify(header, "another-deployment-secret-" + "x" * 32)  # remembered per secret
    clock.now += TOKEN_TTL_S + LEEWAY_S + 1
    with pytest.raises(InvalidServiceTokenError, match="expired"):
        verifier.verify(header, SECRET)
    with pytest.raises(InvalidServiceTokenError, match="no bearer token"):
        verifier.verify(None, SECRET)


def test_the_verifier_stays_bounded() -> None:
    clock = Clock()
    verifier = TokenVerifier("payment-agent", capacity=4, clock=clock)
    for issuer in range(10):
        verifier.verify(f"Bearer {mint(issuer=f'service-{issuer}')}", SECRET)
    assert len(verifier._verified) <= 4


# ---------------------------------------------------------------------------------------------- the secret


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (None, "is not set"),
        ("", "is not set"),
        ("   ", "is not set"),
        ("concierge-dev-token", "well-known"),
        ("short-secret", "too short"),
    ],
)
def test_no_usable_secret_is_one_line_saying_what_to_do(value: str | None, reason: str) -> None:
    settings = Settings(CONCIERGE_SERVICE_SECRET=value)  # type: ignore[call-arg]
    with pytest.raises(MissingSecretError, match=reason) as info:
        service_secret(settings)
    assert "\n" not in str(info.value)
    assert "CONCIERGE_SERVICE_SECRET" in str(info.value)


def test_a_long_random_secret_is_used_and_never_shown() -> None:
    settings = Settings(CONCIERGE_SERVICE_SECRET=SECRET)  # type: ignore[call-arg]
    assert service_secret(settings) == SECRET
    assert SECRET not in repr(settings)


def test_the_identity_is_the_running_services_and_put_back_after(secret_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(NoServiceIdentityError):
        service_tokens()
    with use_service_identity("recovery-worker", get_settings()):
        token = service_tokens().token("payment-agent")
        assert verify_service_token(token, secret=SECRET, audience="payment-agent").issuer == "recovery-worker"
        # a tool may still speak for someone else, with the same secret
        assert service_tokens("search-agent", get_settings()).issuer == "search-agent"
    with pytest.raises(NoServiceIdentityError):
        service_tokens()


def test_no_identity_without_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CONCIERGE_SERVICE_SECRET", raising=False)
    get_settings.cache_clear()
    try:
        with pytest.raises(MissingSecretError):
            use_service_identity("booking-agent", get_settings())
    finally:
        get_settings.cache_clear()


# ---------------------------------------------------------------------------------------------- admin token


def test_the_admin_token_is_optional_and_empty_means_unset() -> None:
    assert admin_token(Settings()) is None  # type: ignore[call-arg]
    assert admin_token(Settings(CONCIERGE_ADMIN_TOKEN="")) is None  # type: ignore[call-arg]
    assert admin_token(Settings(CONCIERGE_ADMIN_TOKEN="s3cret")) == "s3cret"  # type: ignore[call-arg]


def test_admin_token_ok() -> None:
    assert admin_token_ok("Bearer s3cret", "s3cret")
    assert not admin_token_ok("Bearer s3cre", "s3cret")
    assert not admin_token_ok("Basic s3cret", "s3cret")
    assert not admin_token_ok("s3cret", "s3cret")
    assert not admin_token_ok(None, "s3cret")


# ---------------------------------------------------------------------------------------------- provider client keys

OTHER_SECRET = "another-deployment-" + "fedcba9876543210" * 2


def settings(secret: str | None = SECRET, **env: str) -> Settings:
    return Settings(**({"CONCIERGE_SERVICE_SECRET": secret} if secret else {}), **env)  # type: ignore[arg-type]


def test_each_client_of_each_provider_derives_a_key_of_its_own() -> None:
    keys = {
        (provider, client): provider_api_key(provider, client, settings())
        for provider in PROVIDER_CLIENTS
        for client in ("booking-agent", "search-agent", "payment-agent")
    }
    assert len(set(keys.values())) == len(keys), "no two (provider, client) pairs share a key"
    assert all(k is not None and k.startswith(PROVIDER_KEY_PREFIX) and SECRET not in k for k in keys.values())
    assert keys["hotel-api", "booking-agent"] == derived_provider_key(SECRET, "hotel-api", "booking-agent")
    assert provider_api_key("hotel-api", "booking-agent", settings(OTHER_SECRET)) != keys["hotel-api", "booking-agent"]
    assert keys["payment-api", "payment-agent"] != llm_api_key(settings())


def test_a_provider_takes_its_clients_keys_and_no_other() -> None:
    config = settings()
    for provider, clients in PROVIDER_CLIENTS.items():
        for client in clients:
            assert provider_api_key_ok(provider, f"Bearer {provider_api_key(provider, client, config)}", config)
    assert not provider_api_key_ok(
        "hotel-api", f"Bearer {provider_api_key('hotel-api', 'payment-agent', config)}", config
    )
    assert not provider_api_key_ok(
        "payment-api", f"Bearer {provider_api_key('payment-api', 'booking-agent', config)}", config
    )
    hotel_key = provider_api_key("hotel-api", "booking-agent", config)
    assert not provider_api_key_ok("payment-api", f"Bearer {hotel_key}", config), "another provider's key"
    other = provider_api_key("hotel-api", "booking-agent", settings(OTHER_SECRET))
    assert not provider_api_key_ok("hotel-api", f"Bearer {other}", config), "another deployment's key"
    for header in (None, "", "Bearer ", f"Basic {hotel_key}", str(hotel_key), f"Bearer {hotel_key}x"):
        assert not provider_api_key_ok("hotel-api", header, config), header


def test_a_configured_key_is_the_one_sent_and_the_one_accepted() -> None:
    config = settings(HOTEL_API_KEY="hk-from-the-provider")
    assert provider_api_key("hotel-api", "booking-agent", config) == "hk-from-the-provider"
    assert provider_api_key("hotel-api", "search-agent", config) == "hk-from-the-provider"
    assert provider_api_key_ok("hotel-api", "Bearer hk-from-the-provider", config)
    derived = derived_provider_key(SECRET, "hotel-api", "booking-agent")
    assert not provider_api_key_ok("hotel-api", f"Bearer {derived}", config), "set, it is the only key"
    # payment-api is not concerned; an empty value (docker-compose passing an unset one through) is no key
    assert provider_api_key("payment-api", "payment-agent", config) == derived_provider_key(
        SECRET, "payment-api", "payment-agent"
    )
    assert provider_api_key("hotel-api", "booking-agent", settings(HOTEL_API_KEY=" ")) == derived


def test_without_a_secret_or_a_client_there_is_no_key_and_nobody_gets_in() -> None:
    assert provider_api_key("hotel-api", "booking-agent", settings(None)) is None
    assert not provider_api_key_ok("hotel-api", "Bearer anything", settings(None))
    assert provider_api_key("hotel-api", None, settings()) is None, "no client named, no service identity"
    assert provider_api_key("hotel-api", None, settings(None, HOTEL_API_KEY="hk")) == "hk"


def test_a_service_presents_its_own_key_by_default(secret_env: pytest.MonkeyPatch) -> None:
    with use_service_identity("search-agent", get_settings()):
        assert provider_api_key("hotel-api", None, get_settings()) == derived_provider_key(
            SECRET, "hotel-api", "search-agent"
        )
