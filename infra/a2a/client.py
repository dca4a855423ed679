"""The A2A client side: ``A2AClient(base_url, audience=<peer's service name>)`` calls one peer agent's skills.

One pooled ``infra.http.create_http_client(base_url, audience=...)`` (budget, ``traceparent`` and service token
headers on every request) under the SDK's ``JsonRpcTransport``; the whole call is bounded by the remaining budget
too. The token names this service and the peer (``identity.auth``): the peer refuses one minted for anyone else.

The SDK's client side (``a2a.client``: its transports and, through ``a2a.client.optionals``, ``grpc``; 0.2 s) is
imported with the first call, in a worker thread so the loop keeps answering, not when the service starts: the
transport is built then (docs/benchmarks.md#start-up).
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
import uuid
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Self

import httpx
from a2a.types.a2a_pb2 import (
    AgentCard,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SendMessageResponse,
    TaskState,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, VERSION_HEADER
from a2a.utils.errors import A2AError as SdkA2AError
from a2a.utils.errors import InternalError as SdkInternalError
from a2a.utils.errors import InvalidAgentResponseError as SdkInvalidAgentResponseError
from opentelemetry import trace

from domain.booking import JournalKind
from infra.a2a.errors import (
    A2AProtocolError,
    A2ASkillError,
    A2ATimeoutError,
    A2AUnauthorizedError,
    A2AUnavailableError,
)
from infra.a2a.wire import A2A_PATH, AGENT_CARD_PATH, data_part, first_data
from infra.http import create_http_client, never_connected
from infra.journal import note
from resilience.budget import remaining_budget
from resilience.errors import (
    BudgetExhaustedError,
)

if TYPE_CHECKING:
    from a2a.client.transports.jsonrpc import JsonRpcTransport

_tracer = trace.get_tracer("concierge.a2a")

SDK_CLIENT_MODULES = ("a2a.client.errors", "a2a.client.transports.jsonrpc")
"""The SDK's client side, imported with the first call (``load_sdk_client``), not at start."""
_sdk_client_loaded = False


def _import_sdk_client() -> None:
    for name in SDK_CLIENT_MODULES:
        importlib.import_module(name)


async def load_sdk_client() -> None:
    """Import the SDK's client side in a worker thread (the loop keeps answering meanwhile); at once when loaded.

    Done means the import finished, not begun: a module another thread is still importing is already in
    ``sys.modules``, and importing it on the loop's thread would wait there for that thread. Calls racing to be
    first each wait in a worker thread instead (the import lock lets one of them run it).
    """
    global _sdk_client_loaded
    if not _sdk_client_loaded:
        await asyncio.to_thread(_import_sdk_client)
        _sdk_client_loaded = True


class A2AClient:
    """Calls one peer agent's skills. One instance per peer, shared by all requests (it pools connections).

    ``audience`` is the peer's service name (``search-agent``...), the ``aud`` of the tokens sent; ``issuer`` names
    the caller when it is not the running service itself (tests, tools). ``http`` replaces the whole HTTP client,
    tokens included.
    """

    def __init__(
        self,
        base_url: str,
        *,
        audience: str,
        issuer: str | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self.audience = audience
        self._owns_http = http is None
        self._http = http if http is not None else create_http_client(self._base_url, audience=audience, issuer=issuer)
        self._http.headers.setdefault(VERSION_HEADER, PROTOCOL_VERSION_CURRENT)
        self._transport: JsonRpcTransport | None = None  # with the first call: ``_jsonrpc``
        self._configuration = SendMessageConfiguration(history_length=0)

    @property
    def base_url(self) -> str:
        return self._base_url

    async def _jsonrpc(self) -> JsonRpcTransport:
        if self._transport is None:
            await load_sdk_client()
            from a2a.client.transports.jsonrpc import JsonRpcTransport  # loaded just above: a lookup

            # Talking to the transport directly skips a card fetch per peer and the client's interceptor chain;
            # the endpoint path is fixed by our contract, not discovered.
            self._transport = JsonRpcTransport(
                self._http, AgentCard(name=self._base_url), f"{self._base_url}{A2A_PATH}", is_shared_httpx=True
            )
        return self._transport

    async def call(self, skill: str, data: dict[str, Any]) -> dict[str, Any]:
        """Run ``skill`` on the peer with ``data`` as its input; the result dict, or an ``A2AError``."""
        request = SendMessageRequest(
            message=Message(
                role=Role.ROLE_USER,
                message_id=uuid.uuid4().hex,
                parts=[data_part({"skill": skill, "input": data})],
            ),
            configuration=self._configuration,
        )
        with _tracer.start_as_current_span(
            f"a2a.call {skill}",
            kind=trace.SpanKind.CLIENT,
            attributes={"a2a.skill": skill, "a2a.peer": self._base_url},
        ):
            started = time.perf_counter()
            outcome = "no answer"
            try:
                response = await self._send(skill, request)
                result = _result_of(skill, response)
                outcome = "ok"
                return result
            except Exception as exc:
                outcome = type(exc).__name__
                raise
            finally:
                note(
                    JournalKind.CALL,
                    dependency=self.audience,
                    operation=skill,
                    outcome=outcome,
                    replayed=False,  # whether the peer acted again, its own calls say (payment-agent journals them)
                    duration_ms=round((time.perf_counter() - started) * 1000, 1),
                )

    async def _send(self, skill: str, request: SendMessageRequest) -> SendMessageResponse:
        transport = await self._jsonrpc()
        from a2a.client.errors import A2AClientTimeoutError  # loaded with the transport: a lookup

        # httpx's timeout is per phase (connect, write, read); this bounds the whole call by the budget.
        scope = asyncio.timeout(remaining_budget())
        try:
            async with scope:
                return await transport.send_message(request)
        except TimeoutError as exc:
            sent = not never_connected(exc)
            if isinstance(exc, BudgetExhaustedError) or scope.expired():
                raise A2ATimeoutError(f"{skill} on {self._base_url}: {exc or 'budget exhausted'}", sent=sent) from exc
            raise A2AUnavailableError(f"{skill} on {self._base_url}: {exc!r}", sent=sent) from exc
        except A2AClientTimeoutError as exc:
            raise A2ATimeoutError(
                f"{skill} on {self._base_url}: no answer within the budget", sent=not never_connected(exc)
            ) from exc
        except SdkA2AError as exc:
            _raise_transport_error(f"{skill} on {self._base_url}", exc)
        except httpx.HTTPError as exc:
            raise A2AUnavailableError(f"{skill} on {self._base_url}: {exc!r}", sent=not never_connected(exc)) from exc

    async def agent_card(self) -> dict[str, Any]:
        """The peer's agent card as served (JSON)."""
        where = f"agent card of {self._base_url}"
        try:
            response = await self._http.get(f"{self._base_url}{AGENT_CARD_PATH}")
            response.raise_for_status()
            card = response.json()
        except BudgetExhaustedError as exc:
            raise A2ATimeoutError(f"{where}: {exc}") from exc
        except httpx.TimeoutException as exc:
            raise A2ATimeoutError(f"{where}: no answer within the budget") from exc
        except httpx.HTTPStatusError as exc:
            _raise_for_status(where, exc.response, exc)
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            raise A2AUnavailableError(f"{where}: {exc!r}") from exc
        if not isinstance(card, dict):
            raise A2AProtocolError(f"{where}: expected a JSON object")
        return card

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _raise_for_status(where: str, response: httpx.Response, cause: BaseException) -> NoReturn:
    status = response.status_code
    detail = _error_detail(response)
    if status in (401, 403):
        raise A2AUnauthorizedError(f"{where}: HTTP {status}: {detail}", status_code=status) from cause
    if status == 429 or status >= 500:
        raise A2AUnavailableError(f"{where}: HTTP {status}: {detail}", code=f"http_{status}") from cause
    raise A2AProtocolError(f"{where}: HTTP {status}: {detail}", code=f"http_{status}") from cause


def _error_detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except (json.JSONDecodeError, UnicodeDecodeError, httpx.ResponseNotRead):
        return response.reason_phrase
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return str(body)[:200]


def _raise_transport_error(where: str, exc: SdkA2AError) -> NoReturn:
    from a2a.client.errors import A2AClientError  # the SDK's client side raised exc: loaded

    cause = exc.__cause__
    if isinstance(cause, httpx.HTTPStatusError):
        _raise_for_status(where, cause.response, exc)
    if isinstance(exc, A2AClientError | SdkInternalError | SdkInvalidAgentResponseError):
        # connection refused/reset, unreadable or non-JSON-RPC replies, a crash inside the peer's A2A stack
        raise A2AUnavailableError(f"{where}: {exc}", sent=not never_connected(exc)) from exc
    raise A2AProtocolError(f"{where}: {type(exc).__name__}: {exc}") from exc


def _result_of(skill: str, response: SendMessageResponse) -> dict[str, Any]:
    if response.HasField("message"):
        parts: Sequence[Part] = response.message.parts
        result = first_data(parts)
    elif response.HasField("task"):
        task = response.task
        state = task.status.state
        if state in (TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_REJECTED):
            _raise_remote(skill, first_data(task.status.message.parts))
        if state == TaskState.TASK_STATE_CANCELED:
            raise A2AUnavailableError(f"{skill}: the peer canceled the task", code="canceled")
        if state != TaskState.TASK_STATE_COMPLETED:
            raise A2AProtocolError(f"{skill}: task ended in unexpected state {TaskState.Name(state)}")
        result = next((r for a in task.artifacts if isinstance(r := first_data(a.parts), dict)), None)
    else:
        raise A2AProtocolError(f"{skill}: the reply holds neither a task nor a message")
    if not isinstance(result, dict):
        raise A2AProtocolError(f"{skill}: the reply has no data part with a result object")
    return result


def _raise_remote(skill: str, payload: Any) -> NoReturn:
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        raise A2AUnavailableError(f"{skill}: the peer failed without saying why", code="internal")
    code = str(error.get("code") or "internal")
    message = str(error.get("message") or code)
    kind = error.get("kind")
    if kind == "business":
        data = error.get("data")
        raise A2ASkillError(code, message, data if isinstance(data, dict) else None)
    if kind == "timeout":
        raise A2ATimeoutError(f"{skill}: {message}", code=code)
    raise A2AUnavailableError(f"{skill}: {message}", code=code)
