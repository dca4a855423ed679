"""The concierge on a real small model (issue 33): what it adds to the model's time to first token, and how many
kept phrasings reach the right approval with and without its coping behaviours.

Run: ``python -m bench.real_model [--requests 10] [--phrasings 11] [--turn-s 300]`` (Redis at ``REDIS_URL``,
Postgres at ``TEST_DATABASE_URL``, the model fetched by ``python scripts/model_server.py fetch``). The bench starts
llama.cpp's server itself (``scripts/model_server.py serve``: Qwen2.5-Coder-0.5B-Instruct Q4_K_M, the kept chat
template, one slot, temperature 0), or uses ``--model-url`` when one is already up. Prints markdown tables and
writes ``bench/results/real_model.json``.

- **First token.** On a stack of its own (CORE + concierge-agent, ``CONCIERGE_AUTH=off``, ``LLM_GUIDED_TOOLS=off``:
  a guided first call must call a tool) pointed at the server: a new chat
  and one plain message ("What can you do? Answer in one sentence. (N)": this model answers it in words, and a
  ``token`` entry is text; a number in it so no two prompts are the same and the server's prompt cache keeps only
  the shared prefix, the system prompt and the tools, as in a real turn). The concierge's time to
  first token is the wall-clock time from just before the message's POST to the ``at`` of the turn's first
  ``token`` entry in the chat's journal (one machine, one clock): everything a person waits for, the door, the run
  record, the graph, its checkpoint and the model client's layers included. The model's own: the same messages
  (the concierge's system prompt and the person's text) and the same tools (``TOOLS``) sent by a bare
  ``ChatOpenAI(...).bind_tools(TOOLS).astream(...)`` to the same server, from just before the call to its first
  chunk with content or a tool call chunk. Interleaved A B B A …, each request after the previous one has finished
  (the server has one slot), after one warm-up of each; medians, and the concierge's median over the model's.
- **Eval.** Each kept phrasing (``tests/model/phrasings.txt``, dates in it) as a fresh chat on two stacks: this
  checkout ("with coping") and a copy of it with the coping switched off ("without coping", the copy first on the
  services' ``PYTHONPATH``, as ``bench.layer_costs`` does, and ``LLM_GUIDED_TOOLS=off``): every tool offered on
  every call, a repeated read runs again instead of being answered from the earlier result, ``not_offered``
  carries no offers (only its message, without "book one of these"), ``max_price_per_night: 0`` is refused, and
  the last allowed call's tool calls run instead of the turn answering in words. Right: the chat ends awaiting an
  approval whose ``hotel_id`` a search of the chat offered and whose city is the phrasing's. The model runs at
  temperature 0, so the two stacks' runs differ only from the first point where a coping behaviour fires.
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
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._stack import machine, service_stack, write_results
from bench.layer_costs import Edit, make_tree
from domain import canonical_city
from tests.model.server import model_server
from tests.stack import CORE, Stack

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "real_model.json"
PHRASINGS = ROOT / "tests" / "model" / "phrasings.txt"
CITIES = ("Lisbon", "Porto", "Rome", "Madrid", "Paris", "Berlin", "Barcelona")
TARGET_RATIO = 1.05
READY_S = 300.0
MODEL_ENV = {  # a CPU model on a shared machine: the cloud defaults' limits are far too short
    "CONCIERGE_AUTH": "off",
    "LLM_FIRST_TOKEN_TIMEOUT_S": "1200",
    "LLM_TIMEOUT_S": "1800",
    "CONCIERGE_TURN_BUDGET_S": "3600",
    "APPROVAL_TTL_S": "3600",
    "LLM_API_KEY": "sk-local-unused",
}

NO_COPING: tuple[Edit, ...] = (
    Edit(  # a repeated read runs again
        "agents/concierge/graph.py",
        "                key = tool.call_key(args) if tool.answers_repeats else None\n",
        "                key = None\n",
    ),
    Edit(  # the last allowed call's tool calls run (the next call then ends the turn: model_calls_exhausted)
        "agents/concierge/graph.py",
        "        said = _out_of_steps(said)  # the last allowed call: its tool calls are not run, the turn answers\n",
        "        pass\n",
    ),
    Edit(  # max_price_per_night: 0 refused, not read as no limit
        "agents/concierge/tools.py",
        '        None, ge=0, allow_inf_nan=False, description="0 or absent: no limit."\n',
        "        None, gt=0, allow_inf_nan=False\n",
    ),
    Edit(  # not_offered without the offers
        "agents/concierge/tools.py",
        'for this stay; nothing was booked. "\n'
        '            "Book one of these offers by its hotel_id, or tell the person.",\n'
        "            offers=shown,\n"
        "            found=len(offers),\n",
        'for this stay; nothing was booked.",\n',
    ),
)


def log(message: str) -> None:
    print(f"[real_model {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- the model server


# ----------------------------------------------------------------------------------------------- the chats


def _agent(stack: Stack, path: str) -> str:
    return f"{stack.url('concierge-agent')}{path}"


def new_chat(stack: Stack) -> str:
    response = stack.http.post(_agent(stack, "/chats"))
    response.raise_for_status()
    return str(response.json()["chat_id"])


def say(stack: Stack, chat_id: str, text: str) -> None:
    body = {"text": text, "payment_token": "tok_visa"}
    response = stack.http.post(_agent(stack, f"/chats/{chat_id}/messages"), json=body)
    if response.status_code != 202:
        raise RuntimeError(f"POST message: {response.status_code} {response.text}")


def settled(stack: Stack, chat_id: str, limit_s: float) -> dict[str, Any]:
    """The chat once its turn stopped running, or as it is after ``limit_s`` (status still ``running``)."""
    deadline = time.monotonic() + limit_s
    while True:
        wait = max(1.0, min(30.0, deadline - time.monotonic()))
        response = stack.http.get(_agent(stack, f"/chats/{chat_id}"), params={"wait": wait}, timeout=wait + 30)
        response.raise_for_status()
        view = dict(response.json())
        if view["status"] != "running" or time.monotonic() > deadline:
            return view
        time.sleep(0.3)


def events(stack: Stack, chat_id: str) -> list[dict[str, Any]]:
    response = stack.http.get(_agent(stack, f"/chats/{chat_id}/events"))
    response.raise_for_status()
    return list(response.json()["events"])


def _wall(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# ----------------------------------------------------------------------------------------------- first token


def plain(n: int) -> str:
    """A message this model answers in words (a ``token`` entry is text; "hello, thanks" gets a tool call from it)."""
    return f"What can you do? Answer in one sentence. ({1000 + n})"


def concierge_ttft(stack: Stack, text: str, limit_s: float) -> dict[str, Any]:
    chat_id = new_chat(stack)
    posted = time.time()
    say(stack, chat_id, text)
    view = settled(stack, chat_id, limit_s)
    every = events(stack, chat_id)
    tokens = [e for e in every if e["kind"] == "token" and e.get("call", 1) == 1]
    started = next((e for e in every if e["kind"] == "user_message"), None)
    calls = [e["name"] for e in every if e["kind"] == "tool_call"]
    return {
        "ttft_s": _wall(tokens[0]["at"]) - posted if tokens else None,
        "turn_start_s": _wall(started["at"]) - posted if started else None,
        "status": view["status"],
        "tool_calls": calls,
    }


async def bare_ttft(url: str, alias: str, text: str) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    from agents.concierge.prompts import system_prompt
    from agents.concierge.tools import TOOLS

    model = ChatOpenAI(
        model=alias, base_url=f"{url}/v1", api_key=SecretStr("sk-local-unused"), max_retries=0, stream_usage=True
    )
    bound = model.bind_tools(list(TOOLS))
    messages = [SystemMessage(content=system_prompt()), HumanMessage(content=text)]
    first: float | None = None
    kind = ""
    begun = time.perf_counter()
    async for chunk in bound.astream(messages):
        if first is None and (chunk.content or getattr(chunk, "tool_call_chunks", None)):
            first = time.perf_counter() - begun
            kind = "text" if chunk.content else "tool_call"
    return {"ttft_s": first, "first": kind}


def first_token(stack: Stack, url: str, alias: str, requests: int, limit_s: float) -> dict[str, Any]:
    loop = asyncio.new_event_loop()  # one loop: langchain_openai keeps its HTTP client (bound to a loop) across calls
    try:
        return _first_token(stack, url, alias, requests, limit_s, loop)
    finally:
        loop.close()


def _first_token(
    stack: Stack, url: str, alias: str, requests: int, limit_s: float, loop: asyncio.AbstractEventLoop
) -> dict[str, Any]:
    log("first token: warm-up")
    concierge_ttft(stack, plain(0), limit_s)
    loop.run_until_complete(bare_ttft(url, alias, plain(1)))
    rows: list[dict[str, Any]] = []
    for i in range(requests):
        order = ("concierge", "bare") if i % 2 == 0 else ("bare", "concierge")
        for j, who in enumerate(order):
            text = plain(10 + 2 * i + j)
            if who == "concierge":
                row = concierge_ttft(stack, text, limit_s)
            else:
                row = loop.run_until_complete(bare_ttft(url, alias, text))
            rows.append({"who": who, "i": i, "load1": os.getloadavg()[0], **row})
            log(f"first token {i} {who}: {row['ttft_s']}")
    concierge = [r["ttft_s"] for r in rows if r["who"] == "concierge" and r["ttft_s"] is not None]
    bare = [r["ttft_s"] for r in rows if r["who"] == "bare" and r["ttft_s"] is not None]
    summary: dict[str, Any] = {"requests": requests, "rows": rows}
    if concierge and bare:
        c, b = statistics.median(concierge), statistics.median(bare)
        summary |= {
            "concierge_p50_s": c,
            "bare_p50_s": b,
            "added_p50_s": c - b,
            "ratio": c / b,
            "concierge_n": len(concierge),
            "bare_n": len(bare),
            "concierge_min_s": min(concierge),
            "bare_min_s": min(bare),
            "concierge_max_s": max(concierge),
            "bare_max_s": max(bare),
        }
    return summary


# ----------------------------------------------------------------------------------------------- the eval


def city_of(phrasing: str) -> str | None:
    return next((c for c in CITIES if c.lower() in phrasing.lower()), None)


def judge(stack: Stack, chat_id: str, phrasing: str, view: dict[str, Any]) -> dict[str, Any]:
    every = events(stack, chat_id)
    searches = {e["tool_call_id"] for e in every if e["kind"] == "tool_call" and e["name"] == "search_hotels"}
    offered: set[str] = set()
    repeated = not_offered = 0
    for e in every:
        if e["kind"] != "tool_result":
            continue
        content = e.get("content")
        if e.get("repeated"):
            repeated += 1
        if "not_offered" in json.dumps(content):
            not_offered += 1
        if e["tool_call_id"] in searches and e.get("status") == "success" and isinstance(content, dict):
            offered |= {str(o.get("hotel_id")) for o in content.get("offers", [])}
    calls = [e["name"] for e in every if e["kind"] == "tool_call"]
    said = [e.get("text", "") for e in every if e["kind"] == "assistant_message"]
    pending = view.get("pending_approval") or {}
    want = city_of(phrasing)
    right = (
        view["status"] == "awaiting_approval"
        and str(pending.get("hotel_id")) in offered
        and want is not None
        and canonical_city(str(pending.get("city", ""))) == want  # "Lisboa" is Lisbon, as search reads it
    )
    out_of_steps = any(s.startswith("Sorry, I could not finish this in the steps") for s in said)
    return {
        "right": right,
        "status": view["status"],
        "error": (view.get("last_turn") or {}).get("error"),
        "calls": calls,
        "pending": {k: pending.get(k) for k in ("hotel_id", "city", "checkin", "checkout", "guests")} or None,
        "offered": sorted(offered),
        "repeated": repeated,
        "not_offered": not_offered,
        "out_of_steps": out_of_steps,
        "said": said[-1][:200] if said else None,
        "journal": _journal(every),
    }


def _journal(every: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the model did, shortly: its calls with their arguments, and each result's status and error code."""
    lines: list[dict[str, Any]] = []
    for e in every:
        if e["kind"] == "tool_call":
            lines.append({"call": e["name"], "arguments": e.get("arguments")})
        elif e["kind"] == "tool_result":
            content = e.get("content")
            error = content.get("error") if isinstance(content, dict) else None
            line: dict[str, Any] = {"result": e.get("status"), "repeated": bool(e.get("repeated"))}
            if isinstance(error, dict):
                line["error"] = error.get("code")
                line["message"] = str(error.get("message"))[:160]
            if isinstance(content, dict) and "offers" in content:
                line["offers"] = [o.get("hotel_id") for o in content["offers"]]
            lines.append(line)
    return lines


def run_phrasing(stack: Stack, phrasing: str, limit_s: float) -> dict[str, Any]:
    chat_id = new_chat(stack)
    begun = time.monotonic()
    say(stack, chat_id, phrasing)
    view = settled(stack, chat_id, limit_s)
    return {"seconds": round(time.monotonic() - begun, 1), **judge(stack, chat_id, phrasing, view)}


def evaluate(stacks: dict[str, Stack], phrasings: Sequence[str], limit_s: float) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    names = list(stacks)
    for i, phrasing in enumerate(phrasings):
        for name in names if i % 2 == 0 else reversed(names):
            row = {"phrasing": phrasing, "variant": name, **run_phrasing(stacks[name], phrasing, limit_s)}
            rows.append(row)
            log(f"eval {i} {name}: right={row['right']} {row['status']} calls={row['calls']} in {row['seconds']} s")
    return rows


# ----------------------------------------------------------------------------------------------- report


def report(ttft: dict[str, Any] | None, rows: list[dict[str, Any]], variants: Sequence[str]) -> None:
    if ttft and "ratio" in ttft:
        print("\n| time to first token (p50) | seconds |")
        print("|---|---:|")
        print(f"| bare `ChatOpenAI` → llama.cpp (n={ttft['bare_n']}) | {ttft['bare_p50_s']:.3f} |")
        print(f"| concierge: POST → first `token` entry (n={ttft['concierge_n']}) | {ttft['concierge_p50_s']:.3f} |")
        print(f"| added | {ttft['added_p50_s']:+.3f} |")
        print(f"| ratio (target ≤ {TARGET_RATIO:.2f}) | {ttft['ratio']:.3f} |")
    if rows:
        print("\n| phrasing | " + " | ".join(variants) + " |")
        print("|---|" + "---|" * len(variants))
        for phrasing in dict.fromkeys(r["phrasing"] for r in rows):
            cells = []
            for name in variants:
                row = next((r for r in rows if r["phrasing"] == phrasing and r["variant"] == name), None)
                cells.append(_cell(row) if row else "–")
            print(f"| {phrasing} | " + " | ".join(cells) + " |")
        totals = [
            f"**{sum(r['right'] for r in rows if r['variant'] == n)}/{sum(r['variant'] == n for r in rows)}**"
            for n in variants
        ]
        print("| right approvals | " + " | ".join(totals) + " |")


def _cell(row: dict[str, Any]) -> str:
    mark = "✓" if row["right"] else "✗"
    what = row["status"]
    if row["status"] == "awaiting_approval" and not row["right"]:
        what = f"approval {row['pending']}"
    elif row["error"]:
        what = f"{row['status']} ({row['error'].get('code')})"
    notes = [f"{len(row['calls'])} calls"]
    if row["repeated"]:
        notes.append(f"{row['repeated']} repeated")
    if row["not_offered"]:
        notes.append(f"{row['not_offered']} not_offered")
    if row["out_of_steps"]:
        notes.append("out of steps")
    return f"{mark} {what}, {', '.join(notes)}, {row['seconds']:.0f} s"


# ----------------------------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10, help="first-token pairs after the warm-up (0: none)")
    parser.add_argument("--phrasings", type=int, default=11, help="the first N kept phrasings (0: no eval)")
    parser.add_argument("--skip", type=int, default=0, help="start after the first SKIP phrasings (a run in parts)")
    parser.add_argument("--no-baseline", action="store_true", help="the eval with coping only (one stack)")
    parser.add_argument("--turn-s", type=float, default=300.0, help="a chat still running after this is cut")
    parser.add_argument("--model-url", help="a llama.cpp server already up (else one is started)")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    phrasings = [line.strip() for line in PHRASINGS.read_text().splitlines() if line.strip()][
        args.skip : args.skip + args.phrasings
    ]
    variants = ["with coping"] + ([] if args.no_baseline else ["without coping"])
    started = time.time()
    load_before = os.getloadavg()
    with contextlib.ExitStack() as cleanup:
        server_log = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="model-server-"))) / "server.log"
        url, alias = cleanup.enter_context(model_server(server_log, args.model_url))
        env = {**MODEL_ENV, "LLM_BASE_URL": f"{url}/v1", "LLM_MODEL": alias}
        services = (*CORE, "concierge-agent")
        log(f"model {alias} at {url}; starting the stack(s)")
        ttft = None
        if args.requests:
            # unguided: a guided first call must call a tool, and only words make the journal's ``token`` entries
            plain_env = {**env, "LLM_GUIDED_TOOLS": "off"}
            with service_stack(redis_url=args.redis_url, env=plain_env, services=services) as stack:
                ttft = first_token(stack, url, alias, args.requests, args.turn_s)
        stacks: dict[str, Stack] = {}
        if phrasings:
            stacks["with coping"] = cleanup.enter_context(
                service_stack(redis_url=args.redis_url, env=env, services=services)
            )
        if "without coping" in variants and phrasings:
            tree = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="concierge-no-coping-")))
            make_tree(tree, NO_COPING)
            patched = {**env, "PYTHONPATH": str(tree), "LLM_GUIDED_TOOLS": "off"}
            stacks["without coping"] = cleanup.enter_context(
                service_stack(redis_url=args.redis_url, env=patched, services=services)
            )
        rows = evaluate(stacks, phrasings, args.turn_s) if phrasings else []
    load_after = os.getloadavg()
    report(ttft, rows, variants)
    result = {
        "machine": machine(),
        "started": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(),
        "minutes": round((time.time() - started) / 60, 1),
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "first_token": ttft,
        "eval": rows,
    }
    write_results(args.output, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
