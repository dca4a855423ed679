"""Who is calling: services by their tokens (``identity.auth``), people by their JWTs (``identity.people``), and
which ``Host`` a service answers (``identity.hosts``). Below infra: the settings are handed in (``Secrets``,
``GateSettings``), so every adapter can check a caller. Per-person quotas count in Redis: ``infra.quotas``.

::

    IdentityError
     ├── ServiceAuthError   a service's credential: missing secret, no identity, a refused token
     └── PeopleError        a person's: unauthenticated, a refused token, a quota, a reused key, no issuer
"""

from identity.auth import (
    IdentityError,
    InvalidServiceTokenError,
    MissingSecretError,
    ServiceClaims,
    ServiceTokens,
    TokenVerifier,
    acting_for,
    admin_token,
    admin_token_ok,
    bearer_credentials,
    llm_api_key,
    person_acted_for,
    provider_api_key,
    provider_api_key_ok,
    service_secret,
    service_tokens,
    use_service_identity,
)
from identity.hosts import AllowedHosts, host_name, is_local_host, parse_allowed_hosts
from identity.people import (
    LOCAL_ISSUER,
    Caller,
    IdempotencyKeyReusedError,
    InvalidPersonTokenError,
    JwksUnavailableError,
    LocalIssuer,
    PeopleConfigError,
    PeopleError,
    PeopleGate,
    PersonAuthError,
    QuotaExceededError,
    UnauthenticatedError,
    person_key,
    www_authenticate,
)

__all__ = [
    "LOCAL_ISSUER",
    "AllowedHosts",
    "Caller",
    "IdempotencyKeyReusedError",
    "IdentityError",
    "InvalidPersonTokenError",
    "InvalidServiceTokenError",
    "JwksUnavailableError",
    "LocalIssuer",
    "MissingSecretError",
    "PeopleConfigError",
    "PeopleError",
    "PeopleGate",
    "PersonAuthError",
    "QuotaExceededError",
    "ServiceClaims",
    "ServiceTokens",
    "TokenVerifier",
    "UnauthenticatedError",
    "acting_for",
    "admin_token",
    "admin_token_ok",
    "bearer_credentials",
    "host_name",
    "is_local_host",
    "llm_api_key",
    "parse_allowed_hosts",
    "person_acted_for",
    "person_key",
    "provider_api_key",
    "provider_api_key_ok",
    "service_secret",
    "service_tokens",
    "use_service_identity",
    "www_authenticate",
]
