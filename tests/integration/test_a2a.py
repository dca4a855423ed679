"""infra/a2a.py over real HTTP: a plain FastAPI app with ``mount_a2a`` served by uvicorn on a free port.

Every call goes through ``A2AClient`` (or raw httpx where the point is what a stranger without our client sees).
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import jwt
import pytest
import uvicorn
from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from identity.auth import mint_service_token
from infra.a2a import (
    A2A_PATH,
    AGENT_CARD_PATH,
    A2AError,
    A2AProtocolError,
    A2ASkillError,
    A2ATimeoutError,
    A2AUnauthorizedError,
    A2AUnavailableError,
)
from infra.a2a.client import A2AClient
from infra.a2a.server import Skill, current_caller, mount_a2a
from infra.http import create_http_client
from infra.settings import get_settings
from infra.telemetry import configure_telemetry
from resilience import BudgetExhaustedError, NonRetryableError, budget_scope, remaining_budget
from tests.conftest import free_port

SECRET = "a2a-test-secret-" + "0123456789abcdef" * 2
AGENT = "test-agent"
CALLER = "booking-agent"


def token(audience: str = AGENT, *, issuer: str = CALLER, secret: str = SECRET, now: float | None = None) -> str:
    """What a service of this deployment presents to ``audience`` (minted now: tokens live a minute)."""
    return mint_service_token(secret, issuer=issuer, audience=audience, now=now)


def bearer(audience: str = AGENT, **kwargs: Any) -> str:
    return f"Bearer {token(audience, **kwargs)}"


BULKHEAD = "a2a_test_agent"


class PaymentDeclinedError(NonRetryableError):
    code = "payment_declined"

    def __init__(self, reason: str) -> None:
        super().__init__(f"card declined: {reason}")
        self.data = {"reason": reason}


class Probe:
    """What the handlers saw, shared with the test (server and client run in the same event loop)."""

    def __init__(self) -> None:
        self.slow_started = asyncio.Event()
        self.slow_cancelled = asyncio.Event()
        self.release = asyncio.Event()
        self.holding = 0
        self.all_held = asyncio.Event()
        self.calls = 0


def build_app(
    probe: Probe, *, native_tracing: bool = True, inline_send: bool = True, streaming: bool = False
) -> FastAPI:
    async def echo(data: dict[str, Any]) -> dict[str, Any]:
        probe.calls += 1
        span = trace.get_current_span().get_span_context()
        with trace.get_tracer("test").start_as_current_span("handler work"):
            pass
        return {"input": data, "budget": remaining_budget(), "trace_id": f"{span.trace_id:032x}"}

    async def decline(data: dict[str, Any]) -> dict[str, Any]:
        raise PaymentDeclinedError(data.get("reason", "insufficient funds"))

    async def crash(data: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("the handler has a bug")

    async def slow(data: dict[str, Any]) -> dict[str, Any]:
        probe.slow_started.set()
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            probe.slow_cancelled.set()
            raise
        return {"finished": True}

    async def whoami(data: dict[str, Any]) -> dict[str, Any]:
        return {"caller": current_caller()}

    async def hold(data: dict[str, Any]) -> dict[str, Any]:
        probe.holding += 1
        if probe.holding == 2:
            probe.all_held.set()
        try:
            await probe.release.wait()
        finally:
            probe.holding -= 1
        return {"held": True}

    # FastAPI 0.165 traces requests natively; without that (or the service shell) the mount adopts traceparent.
    app = FastAPI(telemetry={"tracing": native_tracing})
    mount_a2a(
        app,
        name="test-agent",
        description="Skills that misbehave on purpose.",
        url="http://test-agent.invalid",
        skills=[
            Skill("echo", "Echo", "Returns its input and what the handler saw.", echo, tags=("test",), inputs=("n?",)),
            Skill("decline", "Decline", "Always declines the card.", decline),
            Skill("crash", "Crash", "Always raises an unexpected error.", crash),
            Skill("slow", "Slow", "Sleeps 5 s.", slow),
            Skill("hold", "Hold", "Waits until the test releases it.", hold),
            Skill("vip", "VIP", "Names its caller; booking-agent only.", whoami, callers=("booking-agent",)),
        ],
        bulkhead=BULKHEAD,
        inline_send=inline_send,
        streaming=streaming,
    )
    return app


@asynccontextmanager
async def serve(app: FastAPI) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, lifespan="on", log_level="warning"))
    task = asyncio.create_task(server.serve())
    deadline = time.monotonic() + 10
    while not server.started:
        if task.done() or time.monotonic() > deadline:
            server.should_exit = True
            await task
            raise RuntimeError("uvicorn did not start")
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("CONCIERGE_SERVICE_SECRET", SECRET)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


@pytest.fixture
def probe() -> Probe:
    return Probe()


@pytest.fixture(params=[True, False], ids=["inline-send", "sdk-handler"])
async def agent_url(
    env: pytest.MonkeyPatch, probe: Probe, bulkhead: None, request: pytest.FixtureRequest
) -> AsyncIterator[str]:
    """Each test runs against both server paths: the inline blocking send and the SDK's generic handler."""
    async with serve(build_app(probe, inline_send=request.param)) as url:
        yield url


@pytest.fixture
async def client(agent_url: str) -> AsyncIterator[A2AClient]:
    async with A2AClient(agent_url, audience=AGENT, issuer=CALLER) as c:
        yield c


def rpc_body(skill: str = "echo", data: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": "1",
        "method": "SendMessage",
        "params": {
            "message": {
                "messageId": "m-1",
                "role": "ROLE_USER",
                "parts": [{"data": {"skill": skill, "input": data or {}}}],
            }
        },
    }


# ------------------------------------------------------------------------------------------------ agent card


async def test_agent_card_is_public_and_lists_the_skills(agent_url: str, client: A2AClient) -> None:
    async with httpx.AsyncClient() as raw:
        response = await raw.get(f"{agent_url}{AGENT_CARD_PATH}")
    assert response.status_code == 200
    card = response.json()
    assert card["name"] == "test-agent"
    assert [s["id"] for s in card["skills"]] == ["echo", "decline", "crash", "slow", "hold", "vip"]
    assert card["supportedInterfaces"][0]["url"] == f"http://test-agent.invalid{A2A_PATH}"
    assert "bearer" in card["securitySchemes"]
    assert await client.agent_card() == card


async def test_agent_card_is_cacheable_and_revalidates_with_its_etag(agent_url: str) -> None:
    async with httpx.AsyncClient() as raw:
        first = await raw.get(f"{agent_url}{AGENT_CARD_PATH}")
        again = await raw.get(f"{agent_url}{AGENT_CARD_PATH}", headers={"If-None-Match": first.headers["ETag"]})
    assert first.headers["Cache-Control"] == "public, max-age=300"
    modified = email.utils.parsedate_to_datetime(first.headers["Last-Modified"])
    assert modified <= datetime.datetime.now(datetime.UTC)
    assert again.status_code == 304 and again.headers["Cache-Control"] == "public, max-age=300"


# ------------------------------------------------------------------------------------------------------ auth


async def test_call_without_a_token_is_refused_before_the_handler_runs(agent_url: str, probe: Probe) -> None:
    async with httpx.AsyncClient() as raw:
        response = await raw.post(f"{agent_url}{A2A_PATH}", json=rpc_body(), headers={"A2A-Version": "1.0"})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"

    no_token = create_http_client(agent_url)
    async with A2AClient(agent_url, audience=AGENT, http=no_token) as c:
        with pytest.raises(A2AUnauthorizedError) as info:
            await c.call("echo", {})
    await no_token.aclose()
    assert info.value.status_code == 401
    assert isinstance(info.value, NonRetryableError)
    assert probe.calls == 0


def _alg_none() -> str:
    now = int(time.time())
    claims = {"iss": CALLER, "aud": AGENT, "iat": now, "exp": now + 60}
    return f"Bearer {jwt.encode(claims, None, algorithm='none')}"


# Built when the test runs: a token minted at collection could expire before its test.
REFUSED: dict[str, Callable[[], str]] = {
    "not-a-jwt": lambda: "Bearer wrong-token",
    "basic-scheme": lambda: f"Basic {token()}",
    "no-scheme": token,
    "tampered": lambda: f"{bearer()}x",
    "retired-default-token": lambda: "Bearer concierge-dev-token",
    "the-secret-as-a-static-bearer": lambda: f"Bearer {SECRET}",
    "minted-for-another-agent": lambda: bearer("payment-agent"),
    "signed-with-another-secret": lambda: bearer(secret="another-deployment-secret-" + "x" * 32),
    "expired": lambda: bearer(now=time.time() - 120),
    "alg-none": _alg_none,
}


@pytest.mark.parametrize("authorization", list(REFUSED))
async def test_call_with_a_wrong_token_is_refused(agent_url: str, probe: Probe, authorization: str) -> None:
    async with httpx.AsyncClient() as raw:
        response = await raw.post(
            f"{agent_url}{A2A_PATH}",
            json=rpc_body(),
            headers={"Authorization": REFUSED[authorization](), "A2A-Version": "1.0"},
        )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert probe.calls == 0


async def test_a_skill_with_named_callers_refuses_any_other_service(agent_url: str) -> None:
    async with A2AClient(agent_url, audience=AGENT, issuer="booking-agent") as allowed:
        assert await allowed.call("vip", {}) == {"caller": "booking-agent"}
    async with A2AClient(agent_url, audience=AGENT, issuer="search-agent") as stranger:
        with pytest.raises(A2ASkillError) as info:
            await stranger.call("vip", {})
        assert info.value.code == "forbidden"
        assert "search-agent may not call vip" in info.value.message
        # a skill without a list of callers takes any service of the deployment
        assert (await stranger.call("echo", {}))["input"] == {}


async def test_a_client_holding_another_token_gets_unauthorized(
    env: pytest.MonkeyPatch, agent_url: str, client: A2AClient
) -> None:
    env.setenv("CONCIERGE_SERVICE_SECRET", "rotated-secret-" + "y" * 32)  # the server now expects another secret
    get_settings.cache_clear()
    with pytest.raises(A2AUnauthorizedError):
        await client.call("echo", {})


# ------------------------------------------------------------------------------------------------ round trip


async def test_a_skill_round_trip_returns_the_result_dict(client: A2AClient) -> None:
    data = {"city": "Lisbon", "guests": 2, "price": 99.5, "tags": ["a", 1], "nested": {"ok": True, "none": None}}
    result = await client.call("echo", data)
    assert result["input"] == data
    assert type(result["input"]["guests"]) is int  # protobuf's doubles do not leak into our dicts
    assert type(result["input"]["tags"][1]) is int


async def test_a_business_error_arrives_as_a_skill_error_with_its_code(client: A2AClient) -> None:
    with pytest.raises(A2ASkillError) as info:
        await client.call("decline", {"reason": "stolen card"})
    assert info.value.code == "payment_declined"
    assert info.value.message == "card declined: stolen card"
    assert info.value.data == {"reason": "stolen card"}
    assert isinstance(info.value, NonRetryableError)


async def test_an_unknown_skill_is_a_clear_non_retryable_error(client: A2AClient) -> None:
    with pytest.raises(A2ASkillError) as info:
        await client.call("teleport", {})
    assert info.value.code == "unknown_skill"
    assert "teleport" in info.value.message and "echo" in info.value.message


async def test_a_crashing_handler_is_a_retryable_internal_error(client: A2AClient) -> None:
    with pytest.raises(A2AUnavailableError) as info:
        await client.call("crash", {})
    assert info.value.code == "internal"
    assert not isinstance(info.value, NonRetryableError)
    assert "RuntimeError" in info.value.message


async def test_a_peer_that_is_down_is_unavailable(env: pytest.MonkeyPatch) -> None:
    async with A2AClient(f"http://127.0.0.1:{free_port()}", audience=AGENT, issuer=CALLER) as c:
        with pytest.raises(A2AUnavailableError) as info:
            await c.call("echo", {})
    assert not isinstance(info.value, A2ATimeoutError)


async def test_malformed_params_get_a_json_rpc_invalid_params_error(agent_url: str) -> None:
    async with httpx.AsyncClient() as raw:
        response = await raw.post(
            f"{agent_url}{A2A_PATH}",
            json={"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": "nope"}},
            headers={"Authorization": bearer(), "A2A-Version": "1.0"},
        )
    assert response.status_code == 200
    assert response.json()["error"]["code"] == -32602


async def test_a_peer_that_does_not_speak_a2a_is_a_protocol_error(env: pytest.MonkeyPatch) -> None:
    async with serve(FastAPI()) as url, A2AClient(url, audience=AGENT, issuer=CALLER) as c:
        with pytest.raises(A2AProtocolError) as info:
            await c.call("echo", {})
    assert info.value.code == "http_404"
    assert isinstance(info.value, NonRetryableError)


def text_message(text: str, **fields: str) -> dict[str, Any]:
    return {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [{"text": text}], **fields}


async def test_a_data_part_without_a_skill_is_an_invalid_request(agent_url: str) -> None:
    body = rpc_body()
    body["params"]["message"]["parts"] = [{"data": {"book": "a hotel"}}]
    task = (await rpc(agent_url, "SendMessage", body["params"]))["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    assert task["status"]["message"]["parts"][0]["data"]["error"]["code"] == "invalid_request"


async def test_a_text_message_asks_for_the_data_part_naming_every_skill_and_its_input(
    agent_url: str, probe: Probe
) -> None:
    sent = text_message("book me a hotel")
    task = (await rpc(agent_url, "SendMessage", {"message": sent}))["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    words, data = task["status"]["message"]["parts"]
    assert task["status"]["message"]["role"] == "ROLE_AGENT"
    assert '{"skill": "<id>", "input": {...}}' in words["text"] and "echo (n?)" in words["text"]
    assert data["data"]["expected"] == {"skill": "<skills[].id>", "input": {}}
    skills = {s["id"]: s for s in data["data"]["skills"]}
    assert set(skills) == {"echo", "decline", "crash", "slow", "hold", "vip"}
    assert skills["echo"]["input"] == {"required": [], "optional": ["n"]}
    assert [m["messageId"] for m in task["history"]] == [sent["messageId"]]  # the request, with its task's ids
    assert task["history"][0]["taskId"] == task["id"] and task["history"][0]["contextId"] == task["contextId"]
    assert probe.calls == 0

    # more text in the same task: still waiting; then the data part: the skill runs in that task
    again = text_message("please", taskId=task["id"])
    waiting = (await rpc(agent_url, "SendMessage", {"message": again}))["result"]["task"]
    assert waiting["id"] == task["id"] and waiting["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    reply = {**rpc_body("echo", {"n": 3})["params"]["message"], "messageId": "m-reply", "taskId": task["id"]}
    done = (await rpc(agent_url, "SendMessage", {"message": reply}))["result"]["task"]
    assert done["id"] == task["id"] and done["status"]["state"] == "TASK_STATE_COMPLETED"
    assert done["artifacts"][0]["parts"][0]["data"]["input"] == {"n": 3}
    assert probe.calls == 1
    # every message of the exchange, in order: the client's and the agent's
    history = (await rpc(agent_url, "GetTask", {"id": task["id"]}))["result"]["history"]
    assert [(m["role"], m["messageId"]) for m in history] == [
        ("ROLE_USER", sent["messageId"]),
        ("ROLE_AGENT", task["status"]["message"]["messageId"]),
        ("ROLE_USER", again["messageId"]),
        ("ROLE_AGENT", waiting["status"]["message"]["messageId"]),
        ("ROLE_USER", "m-reply"),
    ]
    last = (await rpc(agent_url, "GetTask", {"id": task["id"], "historyLength": 1}))["result"]["history"]
    assert [m["messageId"] for m in last] == ["m-reply"]
    assert "history" not in (await rpc(agent_url, "GetTask", {"id": task["id"], "historyLength": 0}))["result"]


async def test_a_subscription_to_a_waiting_task_follows_the_reply_and_closes_at_its_end(
    env: pytest.MonkeyPatch, probe: Probe, bulkhead: None
) -> None:
    async with serve(build_app(probe, streaming=True)) as url:
        task = (await rpc(url, "SendMessage", {"message": text_message("hello")}))["result"]["task"]
        states: list[str] = []
        subscribed = asyncio.Event()

        async def subscribe() -> None:
            body = {"jsonrpc": "2.0", "id": "s", "method": "SubscribeToTask", "params": {"id": task["id"]}}
            headers = {"Authorization": bearer(), "A2A-Version": "1.0", "Accept": "text/event-stream"}
            async with (
                httpx.AsyncClient(timeout=httpx.Timeout(10, read=10)) as raw,
                raw.stream("POST", f"{url}{A2A_PATH}", json=body, headers=headers) as stream,
            ):
                async for line in stream.aiter_lines():
                    if line.startswith("data:"):
                        result = json.loads(line[5:])["result"]
                        event = result.get("task") or result.get("statusUpdate")
                        if event is not None:
                            states.append(event["status"]["state"])
                            subscribed.set()

        following = asyncio.create_task(subscribe())
        await asyncio.wait_for(subscribed.wait(), 10)
        reply = {**rpc_body("echo", {"n": 2})["params"]["message"], "messageId": "m-reply", "taskId": task["id"]}
        done = (await rpc(url, "SendMessage", {"message": reply}))["result"]["task"]
        await asyncio.wait_for(following, 10)  # the stream ended by itself
    assert done["status"]["state"] == "TASK_STATE_COMPLETED"
    assert states[0] == "TASK_STATE_INPUT_REQUIRED" and states[-1] == "TASK_STATE_COMPLETED", states


async def test_a_task_waiting_for_its_data_part_can_be_cancelled(agent_url: str) -> None:
    task = (await rpc(agent_url, "SendMessage", {"message": text_message("hello")}))["result"]["task"]
    cancelled = (await rpc(agent_url, "CancelTask", {"id": task["id"]}))["result"]
    assert cancelled["status"]["state"] == "TASK_STATE_CANCELED"
    reply = {**rpc_body("echo")["params"]["message"], "messageId": "late", "taskId": task["id"]}
    refused = await rpc(agent_url, "SendMessage", {"message": reply})
    assert "error" in refused, refused


async def test_a_task_keeps_its_request_in_its_history_and_honours_history_length(agent_url: str) -> None:
    sent = (await rpc(agent_url, "SendMessage", rpc_body("echo", {"n": 1})["params"]))["result"]["task"]
    assert [m["messageId"] for m in sent["history"]] == ["m-1"]
    assert sent["history"][0]["parts"][0]["data"] == {"skill": "echo", "input": {"n": 1}}
    found = (await rpc(agent_url, "GetTask", {"id": sent["id"], "historyLength": 5}))["result"]
    assert [m["messageId"] for m in found["history"]] == ["m-1"]
    params = {**rpc_body("decline")["params"], "configuration": {"historyLength": 0}}
    failed = (await rpc(agent_url, "SendMessage", params))["result"]["task"]
    assert failed["status"]["state"] == "TASK_STATE_FAILED" and "history" not in failed
    kept = (await rpc(agent_url, "GetTask", {"id": failed["id"]}))["result"]
    assert [m["messageId"] for m in kept["history"]] == ["m-1"]  # historyLength cut the answer, not the task


async def test_a_client_that_appends_a_slash_to_the_endpoint_is_served(agent_url: str) -> None:
    async with httpx.AsyncClient() as raw:
        served = await raw.post(
            f"{agent_url}{A2A_PATH}/", json=rpc_body(), headers={"Authorization": bearer(), "A2A-Version": "1.0"}
        )
        anonymous = await raw.post(f"{agent_url}{A2A_PATH}/", json=rpc_body(), headers={"A2A-Version": "1.0"})
    assert served.status_code == 200 and served.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    assert anonymous.status_code == 401


# ------------------------------------------------------------------------------------ the SDK's other methods


async def rpc(agent_url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    async with httpx.AsyncClient() as raw:
        response = await raw.post(
            f"{agent_url}{A2A_PATH}",
            json={"jsonrpc": "2.0", "id": "1", "method": method, "params": params},
            headers={"Authorization": bearer(), "A2A-Version": "1.0"},
        )
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_a_task_history_keeps_no_payment_token_though_the_skill_got_it(agent_url: str) -> None:
    secret = {"n": 1, "payment_token": "tok_secret_1", "nested": [{"payment_token": "tok_secret_2"}]}
    sent = (await rpc(agent_url, "SendMessage", rpc_body("echo", secret)["params"]))["result"]["task"]
    assert sent["artifacts"][0]["parts"][0]["data"]["input"] == secret  # the skill ran with it
    kept = (await rpc(agent_url, "GetTask", {"id": sent["id"]}))["result"]
    assert kept["history"][0]["parts"][0]["data"]["input"] == {
        "n": 1,
        "payment_token": "[redacted]",
        "nested": [{"payment_token": "[redacted]"}],
    }
    # a reply to a task waiting for input is kept the same way
    task = (await rpc(agent_url, "SendMessage", {"message": text_message("book")}))["result"]["task"]
    reply = {**rpc_body("echo", {"payment_token": "tok_secret_3"})["params"]["message"], "taskId": task["id"]}
    reply["messageId"] = "m-token"
    await rpc(agent_url, "SendMessage", {"message": reply})
    history = (await rpc(agent_url, "GetTask", {"id": task["id"]}))["result"]["history"]
    assert "tok_secret" not in str(history) and "[redacted]" in str(history)


async def test_a_blocking_send_answers_with_a_terminal_task_that_get_task_finds(agent_url: str, probe: Probe) -> None:
    sent = (await rpc(agent_url, "SendMessage", rpc_body("echo", {"n": 1})["params"]))["result"]["task"]
    assert sent["status"]["state"] == "TASK_STATE_COMPLETED"
    assert sent["artifacts"][0]["parts"][0]["data"]["input"] == {"n": 1}
    assert probe.calls == 1

    found = (await rpc(agent_url, "GetTask", {"id": sent["id"]}))["result"]
    assert found["id"] == sent["id"] and found["contextId"] == sent["contextId"]
    assert found["status"]["state"] == "TASK_STATE_COMPLETED"
    assert found["artifacts"] == sent["artifacts"]
    assert probe.calls == 1, "reading a task must not run the skill again"


async def test_a_send_keeps_the_callers_context_id(agent_url: str) -> None:
    params = rpc_body()["params"]
    params["message"]["contextId"] = "conversation-7"
    task = (await rpc(agent_url, "SendMessage", params))["result"]["task"]
    assert task["contextId"] == "conversation-7"


async def test_a_non_blocking_send_is_served_by_the_sdk_and_completes_in_the_background(
    agent_url: str, probe: Probe
) -> None:
    params = rpc_body("hold")["params"]
    params["configuration"] = {"returnImmediately": True}
    first = (await rpc(agent_url, "SendMessage", params))["result"]["task"]
    assert first["status"]["state"] in {"TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"}
    probe.release.set()
    deadline = time.monotonic() + 10
    while True:
        task = (await rpc(agent_url, "GetTask", {"id": first["id"]}))["result"]
        if task["status"]["state"] == "TASK_STATE_COMPLETED":
            break
        assert time.monotonic() < deadline, task["status"]
        await asyncio.sleep(0.02)
    [artifact] = task["artifacts"]
    assert artifact["name"] == "result" and artifact["parts"][0]["data"] == {"held": True}


async def test_a_message_naming_an_unknown_task_is_refused_by_the_sdk(agent_url: str, probe: Probe) -> None:
    params = rpc_body()["params"]
    params["message"]["taskId"] = "no-such-task"
    answer = await rpc(agent_url, "SendMessage", params)
    assert answer["error"]["code"] == -32001  # TaskNotFoundError
    assert probe.calls == 0


async def test_get_task_for_an_unknown_id_is_task_not_found(agent_url: str) -> None:
    answer = await rpc(agent_url, "GetTask", {"id": "no-such-task"})
    assert answer["error"]["code"] == -32001


# ---------------------------------------------------------------------------------------------------- budget


async def test_the_handler_runs_under_the_callers_budget_minus_the_margin(client: A2AClient) -> None:
    with budget_scope(2.0):
        result = await client.call("echo", {})
    assert 1.0 < result["budget"] < 2.0  # not the 30 s default: the header reached the handler's context


async def test_the_handler_is_cancelled_when_the_budget_ends(client: A2AClient, probe: Probe) -> None:
    with budget_scope(0.3), pytest.raises(A2ATimeoutError) as info:
        await client.call("slow", {})  # had it waited for the 5 s handler, the call would have answered
    assert isinstance(info.value, BudgetExhaustedError)  # the booking flow can answer "timeout"
    assert probe.slow_started.is_set()
    await asyncio.wait_for(probe.slow_cancelled.wait(), timeout=30)  # cut, not run to its end


async def test_no_call_is_made_when_the_budget_is_already_spent(client: A2AClient, probe: Probe) -> None:
    with budget_scope(0.01), pytest.raises(A2ATimeoutError):
        await client.call("echo", {})
    assert probe.calls == 0


@pytest.mark.parametrize("value", ["abc", "-1", "0", "nan", "inf"])
async def test_an_invalid_budget_header_is_a_400(agent_url: str, probe: Probe, value: str) -> None:
    async with httpx.AsyncClient() as raw:
        response = await raw.post(
            f"{agent_url}{A2A_PATH}",
            json=rpc_body(),
            headers={"Authorization": bearer(), "A2A-Version": "1.0", "X-Timeout-Budget": value},
        )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_header"  # the error table's one answer
    assert probe.calls == 0


async def test_a_budget_above_the_maximum_is_capped(env: pytest.MonkeyPatch, agent_url: str) -> None:
    env.setenv("CONCIERGE_MAX_BUDGET_S", "5")
    get_settings.cache_clear()
    async with httpx.AsyncClient() as raw:
        response = await raw.post(
            f"{agent_url}{A2A_PATH}",
            json=rpc_body(),
            headers={"Authorization": bearer(), "A2A-Version": "1.0", "X-Timeout-Budget": "1000"},
        )
    artifact = response.json()["result"]["task"]["artifacts"][0]
    assert 4.0 < artifact["parts"][0]["data"]["budget"] <= 5.0


# ---------------------------------------------------------------------------------------------------- tracing


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    # the project's way to reach the process-wide provider: installs it once, later calls only add exporters
    configure_telemetry("a2a-tests", exporter=exporter)
    yield exporter
    exporter.shutdown()  # processors cannot be removed; a stopped exporter drops what it is still handed


@pytest.mark.parametrize("native_tracing", [False, True], ids=["plain-app", "fastapi-tracing"])
async def test_the_handler_continues_the_callers_trace(
    spans: InMemorySpanExporter, env: pytest.MonkeyPatch, bulkhead: None, native_tracing: bool
) -> None:
    async with (
        serve(build_app(Probe(), native_tracing=native_tracing)) as url,
        A2AClient(url, audience=AGENT, issuer=CALLER) as client,
    ):
        with trace.get_tracer("test").start_as_current_span("caller") as root:
            result = await client.call("echo", {})
    root_ctx = root.get_span_context()
    assert result["trace_id"] == f"{root_ctx.trace_id:032x}"

    finished = {s.context.span_id: s for s in spans.get_finished_spans() if s.context.trace_id == root_ctx.trace_id}
    work = next(s for s in finished.values() if s.name == "handler work")
    chain = []
    span = work
    while span.parent is not None and span.parent.span_id in finished:
        span = finished[span.parent.span_id]
        chain.append(span.name)
    assert span.context.span_id == root_ctx.span_id  # an unbroken parent chain from the handler up to the caller
    assert chain[0] == "a2a.skill echo" and "a2a.call echo" in chain


# -------------------------------------------------------------------------------------------------- bulkhead


async def test_calls_beyond_the_bulkhead_are_refused_quickly(client: A2AClient, probe: Probe) -> None:
    held = [asyncio.create_task(client.call("hold", {})) for _ in range(2)]
    try:
        await asyncio.wait_for(probe.all_held.wait(), timeout=5)
        with pytest.raises(A2AUnavailableError) as info:
            await client.call("hold", {})
        assert not any(task.done() for task in held), "refused while both slots were still held, not once one freed"
        assert info.value.code == "bulkhead_full"
        assert not isinstance(info.value, NonRetryableError)
    finally:
        probe.release.set()
    assert await asyncio.gather(*held) == [{"held": True}, {"held": True}]


def test_errors_form_one_hierarchy() -> None:
    for cls in (A2AUnavailableError, A2ATimeoutError, A2AUnauthorizedError, A2AProtocolError, A2ASkillError):
        assert issubclass(cls, A2AError)
    assert issubclass(A2ATimeoutError, BudgetExhaustedError)
    assert issubclass(A2ASkillError, NonRetryableError)


@pytest.fixture
def bulkhead() -> None:
    from resilience import bulkhead_registry

    bulkhead_registry.configure(BULKHEAD, max_concurrent=2, acquire_timeout=0.1, timeout=30.0)
