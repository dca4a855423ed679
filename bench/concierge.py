"""The concierge's targets (issue 25), each beside its baseline in the same run, on one stack of real processes:
the five services, llm-api, the recovery worker and two concierge-agent replicas (A and B), Postgres checkpoints.

Run: ``python -m bench.concierge [--turns 30] [--clients 100] [--kills 8] [--rounds 2]`` (Redis at ``REDIS_URL``,
Postgres at ``TEST_DATABASE_URL``). Prints a markdown table and writes ``bench/results/concierge.json``; exits 1 if
a target is missed.

- **First token.** A new chat and one plain message a turn ("hello, thanks": words, no tool), the chat's SSE open
  before the POST. The client's time to the first ``token`` event, from just before the POST, minus the
  simulator's own ``first_token_ms`` (its request log), p50; and the relay alone: the client's first token minus
  the wall-clock moment the simulator sent it (``at`` + ``first_token_ms``, one machine, one clock); and the turn's
  start: from just before the POST until the simulator got the request (its ``at``). Baseline: the same request
  straight to llm-api with a streamed ``ChatOpenAI``, minus its ``first_token_ms``.
- **Fan-out.** ``--clients`` SSE clients on one chat (half on each replica) while the model streams a hotel listing
  at ``token_delay_s`` between tokens; each client's rate (characters between its first and last token) over the
  rate the simulator sent them (its log: the answer over ``duration_ms - first_token_ms``). Baseline: one client.
- **kill -9 mid-turn.** A message to A with the model slowed (``first_token_latency_s``); A is killed while the
  model call is in flight; seconds from the kill until B's journal shows the turn ``resumed`` (polled every 10 ms
  on B), p99 (with few kills, the max). Baseline: the same turn with no kill (its total time).
- **Duplicates.** For every kill point of the issue (during the model call, while awaiting approval, right after
  the approval's 202, during the booking's charge; ``--rounds`` each): bookings in booking-agent and captured
  charges in payment-api per approved booking, less one. Target: 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx

from bench._stack import machine, machine_cpu_seconds, percentiles, service_stack, write_results
from tests.procs import ServiceProcess, free_port
from tests.stack import CORE, TEST_DATABASE_URL, Stack

RESULTS = Path(__file__).parent / "results" / "concierge.json"
TARGETS = {"ttft_overhead_p50_ms": 5.0, "fanout_ratio_min": 0.95, "resume_p99_s": 1.0, "duplicates": 0}
PLAIN = "hello, thanks"
SSE_TIMEOUT = httpx.Timeout(10, read=60)
READY_S = 180.0
Entry = dict[str, Any]


def _request(days_ahead: int) -> str:
    checkin = dt.date.today() + dt.timedelta(days=days_ahead)
    return f"Book the cheapest hotel in Lisbon from {checkin.isoformat()} for 2 nights for two"


def _listing(days_ahead: int) -> str:
    checkin = dt.date.today() + dt.timedelta(days=days_ahead)
    return f"Hotels in Lisbon from {checkin.isoformat()} for 2 nights for two"


def _wall(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).timestamp()


async def sse(
    http: httpx.AsyncClient, url: str, chat_id: str, opened: Callable[[], None] | None = None
) -> AsyncIterator[Entry]:
    """The chat's journal over SSE from one replica (entries as dicts, keep-alives skipped); ``opened`` is called
    once the agent has answered the stream's headers."""
    headers = {"Accept": "text/event-stream"}
    async with http.stream("GET", f"{url}/chats/{chat_id}/events", headers=headers, timeout=SSE_TIMEOUT) as response:
        response.raise_for_status()
        if opened is not None:
            opened()
        data: list[str] = []
        async for line in response.aiter_lines():
            if line.startswith(":"):
                continue
            if not line:
                if data:
                    yield json.loads("\n".join(data))
                data = []
                continue
            name, _, value = line.partition(":")
            if name == "data":
                data.append(value.removeprefix(" "))


class Bench:
    def __init__(self, stack: Stack, b: ServiceProcess) -> None:
        self.stack = stack
        self.a = stack.services["concierge-agent"]
        self.b = b
        self.http = httpx.Client(timeout=30)

    # --- helpers ------------------------------------------------------------------------------------------
    def new_chat(self, url: str) -> str:
        response = self.http.post(f"{url}/chats")
        assert response.status_code == 201, response.text
        return str(response.json()["chat_id"])

    def say(self, url: str, chat_id: str, text: str) -> dict[str, Any]:
        response = self.http.post(f"{url}/chats/{chat_id}/messages", json={"text": text})
        assert response.status_code == 202, response.text
        return dict(response.json())

    def chat(self, url: str, chat_id: str, wait: float = 0) -> dict[str, Any]:
        response = self.http.get(f"{url}/chats/{chat_id}", params={"wait": wait} if wait else None, timeout=wait + 30)
        assert response.status_code == 200, response.text
        return dict(response.json())

    def settle(self, url: str, chat_id: str, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                chat = self.chat(url, chat_id, wait=min(20, max(0.1, deadline - time.monotonic())))
            except httpx.TransportError:
                chat = {"status": "unreachable"}
            if chat["status"] not in ("running", "unreachable") or time.monotonic() > deadline:
                return chat
            time.sleep(0.05)

    def approve(self, url: str, chat_id: str, approval_id: str) -> httpx.Response:
        return self.http.post(
            f"{url}/chats/{chat_id}/approvals/{approval_id}", json={"approve": True, "payment_token": "tok_visa"}
        )

    def events(self, url: str, chat_id: str) -> list[Entry]:
        response = self.http.get(f"{url}/chats/{chat_id}/events", headers={"Accept": "application/json"})
        assert response.status_code == 200, response.text
        return list(response.json()["events"])

    def llm_log(self) -> list[Entry]:
        response = self.stack.admin("GET", "llm-api", "requests", params={"limit": 2000})
        assert response.status_code == 200, response.text
        body = response.json()
        return list(body["requests"] if isinstance(body, dict) else body)

    def forget_llm_log(self) -> None:
        self.stack.admin("DELETE", "llm-api", "requests")

    def restart_a(self) -> None:
        if not self.a.alive:
            self.a.start().wait_ready(timeout=READY_S)

    # --- first token ----------------------------------------------------------------------------------------
    async def first_tokens(self, turns: int) -> dict[str, Any]:
        overhead, relay, start, baseline = [], [], [], []
        url = self.a.url
        async with httpx.AsyncClient(timeout=30) as http:
            for _ in range(turns):
                chat_id = self.new_chat(url)
                self.forget_llm_log()
                opened = asyncio.Event()
                first: list[tuple[float, float]] = []

                async def watch(
                    chat_id: str = chat_id, opened: asyncio.Event = opened, first: list[tuple[float, float]] = first
                ) -> None:
                    async for entry in sse(http, url, chat_id, opened.set):
                        if entry.get("kind") == "token" and not first:
                            first.append((time.perf_counter(), time.time()))
                        if entry.get("kind") == "turn_finished":
                            return

                watcher = asyncio.create_task(watch())
                await asyncio.wait_for(opened.wait(), 10)
                sent, sent_wall = time.perf_counter(), time.time()
                response = await http.post(f"{url}/chats/{chat_id}/messages", json={"text": PLAIN})
                assert response.status_code == 202, response.text
                await asyncio.wait_for(watcher, 60)
                (entry,) = [e for e in self.llm_log() if e.get("stream")]
                assert first, f"no token event in chat {chat_id}"
                overhead.append((first[0][0] - sent) * 1000 - entry["first_token_ms"])
                relay.append((first[0][1] - (_wall(entry["at"]) + entry["first_token_ms"] / 1000)) * 1000)
                start.append((_wall(entry["at"]) - sent_wall) * 1000)
            for _ in range(turns):
                baseline.append(await self._direct_first_token())
        return {
            "turns": turns,
            "overhead_ms": percentiles([v / 1000 for v in overhead], scale=1000),
            "relay_ms": percentiles([v / 1000 for v in relay], scale=1000),
            "turn_start_ms": percentiles([v / 1000 for v in start], scale=1000),
            "baseline_overhead_ms": percentiles([v / 1000 for v in baseline], scale=1000),
        }

    async def _direct_first_token(self) -> float:
        """A streamed ChatOpenAI call straight to llm-api: the client's first token minus the simulator's."""
        from langchain_core.messages import HumanMessage
        from langchain_openai import ChatOpenAI

        self.forget_llm_log()
        model = ChatOpenAI(
            base_url=f"{self.stack.url('llm-api')}/v1",
            api_key=self.stack.llm_api_key,  # type: ignore[arg-type]
            model="sim-large",
            max_retries=0,
            streaming=True,
        )
        sent = time.perf_counter()
        first = None
        async for chunk in model.astream([HumanMessage(PLAIN)]):
            if chunk.content and first is None:
                first = time.perf_counter()
        (entry,) = [e for e in self.llm_log() if e.get("stream")]
        assert first is not None
        return float((first - sent) * 1000 - entry["first_token_ms"])

    # --- fan-out --------------------------------------------------------------------------------------------
    async def fanout(self, clients: int, token_delay_s: float) -> dict[str, Any]:
        result = {"clients": clients, "token_delay_s": token_delay_s}
        self.stack.fault("llm-api", token_delay_s=token_delay_s)
        try:
            for label, n in (("baseline_1", 1), (f"clients_{clients}", clients)):
                result[label] = await self._fanout_once(n, days_ahead=60 + n % 7)
        finally:
            self.stack.fault("llm-api")
        return result

    async def _fanout_once(self, n: int, days_ahead: int) -> dict[str, Any]:
        chat_id = self.new_chat(self.a.url)
        limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=n + 10)
        spans: list[tuple[float, float, int]] = []
        async with httpx.AsyncClient(timeout=30, limits=limits) as http:
            ready = 0
            all_open = asyncio.Event()

            def one_open() -> None:
                nonlocal ready
                ready += 1
                if ready == n:
                    all_open.set()

            async def client(i: int) -> None:
                url = (self.a if i % 2 == 0 else self.b).url
                first = last = 0.0
                chars = 0
                tool_done = False
                async for entry in sse(http, url, chat_id, one_open):
                    kind = entry.get("kind")
                    if kind == "tool_result":
                        tool_done = True
                    elif kind == "token" and tool_done:
                        now = time.perf_counter()
                        first = first or now
                        last = now
                        chars += len(str(entry.get("text", "")))
                    elif kind == "turn_finished":
                        break
                spans.append((first, last, chars))

            tasks = [asyncio.create_task(client(i)) for i in range(n)]
            await asyncio.wait_for(all_open.wait(), 30)
            await asyncio.sleep(0.3)
            self.forget_llm_log()
            self.say(self.a.url, chat_id, _listing(days_ahead))
            await asyncio.wait_for(asyncio.gather(*tasks), 120)
        (answer,) = [e for e in self.llm_log() if e.get("stream") and e.get("outcome") == "text"]
        sent_chars = len(answer.get("text") or "")
        model_s = (answer["duration_ms"] - answer["first_token_ms"]) / 1000
        model_rate = sent_chars / model_s
        ratios = [(chars / (last - first)) / model_rate for first, last, chars in spans if last > first]
        complete = sum(1 for _, _, chars in spans if chars >= sent_chars)
        return {
            "model_chars_per_s": round(model_rate, 1),
            "tokens_sent": answer.get("tokens_sent"),
            "ratio_min": min(ratios) if ratios else float("nan"),
            "ratio_p50": statistics.median(ratios) if ratios else float("nan"),
            "complete_clients": complete,
        }

    # --- kill -9 mid-turn -------------------------------------------------------------------------------------
    def resume_after_kill(self, kills: int, latency_s: float) -> dict[str, Any]:
        self.stack.fault("llm-api", first_token_latency_s=latency_s)
        resumed: list[float] = []
        uninterrupted: list[float] = []
        try:
            for _ in range(kills):
                self.restart_a()
                chat_id = self.new_chat(self.a.url)
                self.say(self.a.url, chat_id, PLAIN)
                time.sleep(latency_s / 3)  # the model call is in flight
                self.a.kill()
                killed = time.monotonic()
                resumed.append(self._until_resumed(chat_id, killed))
                assert self.settle(self.b.url, chat_id)["last_turn"]["outcome"] == "answered"
            self.restart_a()
            for _ in range(max(2, kills // 2)):
                chat_id = self.new_chat(self.a.url)
                started = time.monotonic()
                self.say(self.a.url, chat_id, PLAIN)
                self.settle(self.a.url, chat_id)
                uninterrupted.append(time.monotonic() - started)
        finally:
            self.stack.fault("llm-api")
            self.restart_a()
        return {
            "kills": kills,
            "model_first_token_latency_s": latency_s,
            "resumed_s": percentiles(resumed),
            "baseline_turn_s": percentiles(uninterrupted),
        }

    def _until_resumed(self, chat_id: str, killed: float, timeout: float = 30) -> float:
        while time.monotonic() - killed < timeout:
            with contextlib.suppress(httpx.TransportError):
                if any(e.get("kind") == "resumed" for e in self.events(self.b.url, chat_id)):
                    return time.monotonic() - killed
            time.sleep(0.01)
        raise AssertionError(f"chat {chat_id}: no resumed entry {timeout}s after the kill")

    # --- duplicates across kill points ----------------------------------------------------------------------
    def duplicates(self, rounds: int) -> dict[str, Any]:
        points: dict[str, Callable[[int], tuple[str, str]]] = {
            "during the model call": self._kill_in_model_call,
            "while awaiting approval": self._kill_awaiting_approval,
            "right after the approval's 202": self._kill_after_approval,
            "during the booking's charge": self._kill_in_charge,
        }
        result: dict[str, Any] = {}
        day = 100
        for name, run in points.items():
            bookings = charges = 0
            for _ in range(rounds):
                day += 3
                self.restart_a()
                chat_id, url = run(day)
                chat = self.settle(url, chat_id)
                ids = chat.get("bookings") or []
                ledger = self.stack.ledger("payment-api")["charges"]
                listed = self.http.get(f"{self.stack.url('booking-agent')}/bookings", params={"limit": 200}).json()
                checkin = (dt.date.today() + dt.timedelta(days=day)).isoformat()
                made = [b for b in listed["bookings"] if b.get("checkin") == checkin]
                bookings += max(len(made), len(ids)) - 1
                charges += sum(1 for c in ledger if c["reference"] in ids and c["status"] == "captured") - 1
            result[name] = {"rounds": rounds, "duplicate_bookings": bookings, "duplicate_charges": charges}
        self.restart_a()
        return result

    def _pending(self, url: str, chat_id: str) -> dict[str, Any]:
        chat = self.settle(url, chat_id)
        assert chat["status"] == "awaiting_approval", chat
        return dict(chat["pending_approval"])

    def _kill_in_model_call(self, day: int) -> tuple[str, str]:
        self.stack.fault("llm-api", first_token_latency_s=0.6)
        try:
            chat_id = self.new_chat(self.a.url)
            self.say(self.a.url, chat_id, _request(day))
            time.sleep(0.2)
            self.a.kill()
            approval = self._pending(self.b.url, chat_id)
        finally:
            self.stack.fault("llm-api")
        assert self.approve(self.b.url, chat_id, approval["approval_id"]).status_code == 202
        return chat_id, self.b.url

    def _kill_awaiting_approval(self, day: int) -> tuple[str, str]:
        chat_id = self.new_chat(self.a.url)
        self.say(self.a.url, chat_id, _request(day))
        approval = self._pending(self.a.url, chat_id)
        self.a.kill()
        assert self.approve(self.b.url, chat_id, approval["approval_id"]).status_code == 202
        return chat_id, self.b.url

    def _kill_after_approval(self, day: int) -> tuple[str, str]:
        chat_id = self.new_chat(self.a.url)
        self.say(self.a.url, chat_id, _request(day))
        approval = self._pending(self.a.url, chat_id)
        assert self.approve(self.a.url, chat_id, approval["approval_id"]).status_code == 202
        self.a.kill()
        # a repeated answer on the peer (a client retrying) is the same decision, not a second booking
        assert self.approve(self.b.url, chat_id, approval["approval_id"]).status_code == 202
        return chat_id, self.b.url

    def _kill_in_charge(self, day: int) -> tuple[str, str]:
        chat_id = self.new_chat(self.a.url)
        self.say(self.a.url, chat_id, _request(day))
        approval = self._pending(self.a.url, chat_id)
        self.stack.fault("payment-api", latency_s=1.5)
        try:
            assert self.approve(self.a.url, chat_id, approval["approval_id"]).status_code == 202
            deadline = time.monotonic() + 30
            checkin = (dt.date.today() + dt.timedelta(days=day)).isoformat()
            while time.monotonic() < deadline:
                listed = self.http.get(f"{self.stack.url('booking-agent')}/bookings", params={"limit": 50}).json()
                if any(b.get("checkin") == checkin and b["status"] == "paying" for b in listed["bookings"]):
                    break
                time.sleep(0.02)
            self.a.kill()
        finally:
            self.stack.fault("payment-api")
        return chat_id, self.b.url


def table(result: dict[str, Any]) -> str:
    ft, fo, kill, dup = result["first_token"], result["fanout"], result["kill"], result["duplicates"]
    many = fo[f"clients_{fo['clients']}"]
    dup_b = sum(p["duplicate_bookings"] for p in dup.values())
    dup_c = sum(p["duplicate_charges"] for p in dup.values())
    rows = [
        ("measure", "concierge", "baseline (same run)", "target", "met"),
        ("---", "---", "---", "---", "---"),
        (
            "first token at the SSE client − simulator's own, p50",
            f"{ft['overhead_ms']['p50']:.1f} ms (the turn's start, POST → the model asked, "
            f"{ft['turn_start_ms']['p50']:.1f} ms; relay alone {ft['relay_ms']['p50']:.1f} ms)",
            f"{ft['baseline_overhead_ms']['p50']:.1f} ms (ChatOpenAI straight to llm-api)",
            "≤ 5 ms",
            "yes" if ft["overhead_ms"]["p50"] <= TARGETS["ttft_overhead_p50_ms"] else "no",
        ),
        (
            f"tokens reaching {fo['clients']} SSE clients vs the model's rate (min / p50)",
            f"{many['ratio_min']:.3f}× / {many['ratio_p50']:.3f}× ({many['complete_clients']}/{fo['clients']} whole)",
            f"{fo['baseline_1']['ratio_min']:.3f}× (1 client)",
            "≥ 0.95×",
            "yes" if many["ratio_min"] >= TARGETS["fanout_ratio_min"] else "no",
        ),
        (
            f"kill -9 mid-turn → resumed by the peer, p99 of {kill['kills']}",
            f"{kill['resumed_s']['p99']:.2f} s (p50 {kill['resumed_s']['p50']:.2f} s)",
            f"{kill['baseline_turn_s']['p50']:.2f} s (the turn, no kill)",
            "≤ 1 s",
            "yes" if kill["resumed_s"]["p99"] <= TARGETS["resume_p99_s"] else "no",
        ),
        (
            f"duplicate bookings / charges, {len(dup)} kill points × {next(iter(dup.values()))['rounds']}",
            f"{dup_b} / {dup_c}",
            "-",
            "0",
            "yes" if dup_b == 0 and dup_c == 0 else "no",
        ),
    ]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def met(result: dict[str, Any]) -> bool:
    return all(line.endswith("| yes |") for line in table(result).splitlines()[2:])


def run(args: argparse.Namespace) -> dict[str, Any]:
    redis_url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    env = {"PRESENCE_INTERVAL": "0.2", "RUN_LEASE_TTL": "5"}
    busy0, total0 = machine_cpu_seconds()
    with service_stack(
        redis_url=redis_url,
        admin_database_url=os.environ.get("TEST_DATABASE_URL", TEST_DATABASE_URL),
        env=env,
        services=(),
    ) as stack:
        # all at once, with a generous readiness bound: a busy machine takes more than the harness's 30 s
        model = {"LLM_BASE_URL": f"{stack.url('llm-api')}/v1"}
        started = [stack.serve(name, wait=False) for name in (*CORE, "llm-api", "recovery-worker")]
        started.append(stack.serve("concierge-agent", env=model, wait=False))
        b = stack.procs.serve("concierge-agent", port=free_port(), env=model, wait=False)
        for proc in (*started, b):
            proc.wait_ready(timeout=READY_S)
        bench = Bench(stack, b)
        result: dict[str, Any] = {"machine": machine()}
        result["first_token"] = asyncio.run(bench.first_tokens(args.turns))
        print("first token:", json.dumps(result["first_token"]), flush=True)
        result["fanout"] = asyncio.run(bench.fanout(args.clients, args.token_delay))
        print("fan-out:", json.dumps(result["fanout"]), flush=True)
        result["kill"] = bench.resume_after_kill(args.kills, args.model_latency)
        print("kill:", json.dumps(result["kill"]), flush=True)
        result["duplicates"] = bench.duplicates(args.rounds)
        print("duplicates:", json.dumps(result["duplicates"]), flush=True)
    busy1, total1 = machine_cpu_seconds()
    result["machine_busy_fraction"] = round((busy1 - busy0) / max(total1 - total0, 1e-9), 2)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=30, help="turns for the first-token measure")
    parser.add_argument("--clients", type=int, default=100, help="SSE clients on one chat")
    parser.add_argument("--token-delay", type=float, default=0.02, help="the model's seconds between tokens")
    parser.add_argument("--kills", type=int, default=8, help="kill -9 rounds for the resume measure")
    parser.add_argument("--model-latency", type=float, default=1.5, help="the model's first-token latency then")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per kill point for the duplicates")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    result = run(args)
    print()
    print(table(result))
    print(f"\nload: {result['machine']['loadavg']}, machine busy {result['machine_busy_fraction']:.0%} during the run")
    write_results(args.out, result)
    return 0 if met(result) else 1


if __name__ == "__main__":
    sys.exit(main())
