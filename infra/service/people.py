"""Who is calling a public route: ``Who`` (a FastAPI dependency) is the request's ``Caller``, its minute's request
counted against the person's share. The gate and the quotas are the service's (``create_service_app(people=True)``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from domain.errors import ErrorCode
from identity.people import Caller, PeopleGate
from infra.quotas import PersonQuotas, Release
from infra.service.openapi import Answer, error

__all__ = ["PEOPLE_ANSWERS", "Who", "open_stream"]


async def _who(request: Request) -> Caller:
    gate: PeopleGate = request.app.state.people
    caller = await gate.caller(request.headers.get("authorization"))
    if not caller.operator:  # the operator, and everyone with auth off (nobody to share among), has no quota
        quotas: PersonQuotas = request.app.state.quotas
        await quotas.count_request(caller.person)
    return caller


Who = Annotated[Caller, Depends(_who)]
"""The caller of this request: a person (their bearer JWT), the operator (the admin token), or ``anonymous``."""


async def open_stream(request: Request, caller: Caller) -> Release:
    """Count a journal stream against the caller's ``PERSON_MAX_STREAMS`` (429 now, before the stream's 200); await
    what it returns when the stream ends."""
    quotas: PersonQuotas = request.app.state.quotas
    return await quotas.open_stream(None if caller.operator else caller.person)


PEOPLE_ANSWERS: tuple[Answer, ...] = (
    error(
        401,
        ErrorCode.UNAUTHENTICATED,
        ErrorCode.INVALID_TOKEN,
        description="No bearer token (`unauthenticated`, `WWW-Authenticate: Bearer`), or one refused "
        '(`invalid_token`, `WWW-Authenticate: Bearer error="invalid_token"`): a person\'s JWT from the trusted '
        "issuer (docs/deploy.md).",
        headers={"WWW-Authenticate": {"description": "The bearer challenge (RFC 6750).", "schema": {"type": "string"}}},
    ),
    error(
        429,
        ErrorCode.QUOTA_EXCEEDED,
        description="The person's share is used (PERSON_REQUESTS_PER_MIN, PERSON_MAX_STREAMS, "
        "PERSON_TOKENS_PER_DAY): try again after `Retry-After`.",
        headers={"Retry-After": {"description": "Seconds.", "schema": {"type": "string"}}},
    ),
)
