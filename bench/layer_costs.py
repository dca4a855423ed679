"""What each layer around the saga costs one booking: this checkout against copies with one layer taken out.

Run: ``python -m bench.layer_costs [--bookings 400] [--variants tracing,fence,...] [--one-stack]``. For each variant the bench
copies this checkout's tracked files to a temporary directory, applies the variant's edits there (each edit must
match the source exactly once, or the bench stops and names it), and starts two stacks side by side: the baseline
(this checkout) and the variant (the copy first on the services' ``PYTHONPATH``, as ``bench.ab_stacks`` does). One
client then books on both in turn, a block of bookings at a time (baseline, variant, variant, baseline, ...), so a
slower minute slows both; the difference between neighbouring blocks is the layer's price on a booking's latency.
The copies, stacks, databases and keys are removed at the end.

The variants are diagnostics, not options: every layer removed here is one the issues require (tracing, the lease
fence before a side effect, faults read from Redis on every provider request, progress statuses, the idempotency
records of side-effect nodes, every booking's journal) or a choice with a reason (the ``values`` stream gives the final state without
reading the checkpoint back). No setting turns any of them off; the bench edits a throwaway copy.

It also prices the booking's unavoidable parts in the same run, as ``bench.booking_throughput`` does (six bare
FastAPI→FastAPI hops, two direct client requests, the checkpoint writes the database shows), so each row says how
many times the parts the booking takes with that layer gone: the question is whether the issue's bound (2×) is
reachable by removing any of them, or all of them at once (``all``).

``--variants control`` runs the same code on both sides (an A/A run): whatever it reads is the method's own
difference, the floor under every row's. On two stacks that floor is a few milliseconds (two sets of processes
differ for the whole run, by a different amount each run), so a cost near a millisecond is measured with
``--one-stack``: one stack runs a copy in which the layer is behind a switch (``bench_switch.OFF``, read on SIGUSR1),
and the blocks alternate with the layer on and off in the same processes (``compare_switched``). Every variant has
both forms: ``edits`` cut the layer out, ``switched`` put it behind the switch.

Prints a markdown table and writes ``bench/results/layer_costs.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._stack import cpu_seconds, hop_pair, machine, service_stack, write_results
from bench.booking_throughput import (
    CLIENT_REQUESTS,
    SERVICE_HOPS,
    TARGET_LATENCY_FACTOR,
    BookingFactory,
    CheckpointSampler,
    HopSampler,
    StopRule,
    checkpoints_written,
    new_event_loop,
    run_load,
    unavoidable_ms,
)
from tests.stack import Stack

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "layer_costs.json"


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Variant:
    name: str
    removes: str
    edits: tuple[Edit, ...]
    switched: tuple[Edit, ...] | None = None
    """``--one-stack``: the same layer put behind ``bench_switch.OFF`` in the copy instead of cut out of it."""
    in_all: bool = True
    """Taken out by ``all`` too (the server's bounds are not: ``all`` prices the booking path's own layers)."""


SWITCH_MODULE = '''"""Written into the bench's copy only (bench/layer_costs.py --one-stack): one stack runs with and without a layer.

SIGUSR1 makes the process read whether the layer is off: off while the file BENCH_LAYER_OFF_FILE exists.
"""

import os
import signal

_FILE = os.environ.get("BENCH_LAYER_OFF_FILE", "")
OFF = False


def _read(signum: object = None, frame: object = None) -> None:
    global OFF
    OFF = bool(_FILE) and os.path.exists(_FILE)


_read()
signal.signal(signal.SIGUSR1, _read)
'''
SWITCH_IMPORT = Edit(
    "infra/__init__.py", "__all__: list[str] = []\n", "import bench_switch\n\n__all__: list[str] = []\n"
)
"""Every service imports ``infra``: each one installs the switch's handler before its first request."""


def _reads_switch(path: str, after: str = "import asyncio\n") -> Edit:
    return Edit(path, after, f"{after}\nimport bench_switch\n")


VARIANTS: tuple[Variant, ...] = (
    Variant(
        "tracing",
        "every span (sampler ALWAYS_OFF: spans are created but not recorded; context still propagated)",
        (
            Edit(
                "infra/telemetry.py",
                '    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))\n',
                "    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF\n\n"
                "    provider = TracerProvider(\n"
                '        resource=Resource.create({"service.name": service_name}), sampler=ALWAYS_OFF\n'
                "    )\n",
            ),
        ),
        switched=(
            Edit(
                "infra/telemetry.py",
                '    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))\n',
                "    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, DEFAULT_ON, Sampler\n\n"
                "    class _Switched(Sampler):\n"
                "        def should_sample(self, *args: Any, **kwargs: Any) -> Any:\n"
                "            return (ALWAYS_OFF if bench_switch.OFF else DEFAULT_ON).should_sample(*args, **kwargs)\n\n"
                "        def get_description(self) -> str:\n"
                '            return "switched"\n\n'
                "    provider = TracerProvider(\n"
                '        resource=Resource.create({"service.name": service_name}), sampler=_Switched()\n'
                "    )\n",
            ),
            _reads_switch("infra/telemetry.py", "import json\n"),
        ),
    ),
    Variant(
        "fence",
        "the lease check before each side effect (one Redis round trip per side-effect node in booking-agent)",
        (Edit("graph/idempotency.py", "                check = _fence.get()\n", "                check = None\n"),),
        switched=(
            Edit(
                "graph/idempotency.py",
                "                check = _fence.get()\n",
                "                check = None if bench_switch.OFF else _fence.get()\n",
            ),
            _reads_switch("graph/idempotency.py"),
        ),
    ),
    Variant(
        "fault-reads",
        "the providers' read of their faults on every request (one Redis round trip each)",
        (
            Edit(
                "providers/faults.py",
                "        faults = await load_faults(request.app.state.redis, self.provider, self._model)\n",
                "        faults = self._model()\n",
            ),
        ),
        switched=(
            Edit(
                "providers/faults.py",
                "        faults = await load_faults(request.app.state.redis, self.provider, self._model)\n",
                "        faults = (\n"
                "            self._model()\n"
                "            if bench_switch.OFF\n"
                "            else await load_faults(request.app.state.redis, self.provider, self._model)\n"
                "        )\n",
            ),
            _reads_switch("providers/faults.py"),
        ),
    ),
    Variant(
        "progress",
        "the statuses between pending and the outcome (searching, reserving, paying, confirming)",
        (
            Edit(
                "agents/booking/graph.py",
                '    deps.bookings.report(state["booking_id"], status)\n',
                "    return None\n",
            ),
        ),
        switched=(
            Edit(
                "agents/booking/graph.py",
                '    deps.bookings.report(state["booking_id"], status)\n',
                '    if not bench_switch.OFF:\n        deps.bookings.report(state["booking_id"], status)\n',
            ),
            _reads_switch("agents/booking/graph.py"),
        ),
    ),
    Variant(
        "idempotency-records",
        "the claim and the stored result of each side-effect node (two Redis round trips per node)",
        (
            Edit(
                "graph/idempotency.py",
                "        stored, waited = await self._claim_or_wait(client, record, token, "
                "max(1, math.ceil(lease_s * 1000)))\n",
                "        stored, waited = None, False\n",
            ),
            Edit(
                "graph/idempotency.py",
                "        return await self._complete(client, record, token, payload, ttl_s, span)\n",
                "        return json.loads(payload)\n",
            ),
        ),
        switched=(
            Edit(
                "graph/idempotency.py",
                "        stored, waited = await self._claim_or_wait(client, record, token, "
                "max(1, math.ceil(lease_s * 1000)))\n",
                "        stored, waited = (None, False) if bench_switch.OFF else await self._claim_or_wait(client, record, token, "
                "max(1, math.ceil(lease_s * 1000)))\n",
            ),
            Edit(
                "graph/idempotency.py",
                "        return await self._complete(client, record, token, payload, ttl_s, span)\n",
                "        if bench_switch.OFF:\n            return json.loads(payload)\n"
                "        return await self._complete(client, record, token, payload, ttl_s, span)\n",
            ),
            _reads_switch("graph/idempotency.py"),
        ),
    ),
    Variant(
        "journal",
        "every booking's journal: the entries of steps, calls and the recovery queue (on the status writes, or a batch), "
        "and the accepted and final entries in the booking record's scripts",
        (
            Edit(
                "infra/journal.py",
                "    scope = _scope.get()\n    if scope is None or scope.closed or _writer is None:\n        return\n",
                "    return\n",
            ),
            Edit(
                "infra/journal.py",
                "        self._pending.append((booking_id, encode_entry(kind, self.instance, fields)))\n",
                "        return\n",
            ),
            Edit(
                "infra/bookings.py",
                "\nredis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[2])\n"
                "redis.call('EXPIRE', KEYS[3], ARGV[4])\n",
                "\n",
            ),
            Edit(
                "infra/bookings.py",
                "  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[2])\n"
                "  redis.call('EXPIRE', KEYS[3], ARGV[4])\n",
                "",
            ),
        ),
        switched=(
            Edit(
                "infra/journal.py",
                "    scope = _scope.get()\n    if scope is None or scope.closed or _writer is None:\n        return\n",
                "    scope = _scope.get()\n    if scope is None or scope.closed or _writer is None or bench_switch.OFF:\n"
                "        return\n",
            ),
            Edit(
                "infra/journal.py",
                "        self._pending.append((booking_id, encode_entry(kind, self.instance, fields)))\n",
                "        if bench_switch.OFF:\n            return\n"
                "        self._pending.append((booking_id, encode_entry(kind, self.instance, fields)))\n",
            ),
            _reads_switch("infra/journal.py"),
            # the booking scripts append an entry only when they are given one
            # the final status's lines first: once indented, the create script's would match them too
            Edit(
                "infra/bookings.py",
                "  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[2])\n"
                "  redis.call('EXPIRE', KEYS[3], ARGV[4])\n",
                "  if ARGV[2] ~= '' then\n"
                "    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[2])\n"
                "    redis.call('EXPIRE', KEYS[3], ARGV[4])\n"
                "  end\n",
            ),
            Edit(
                "infra/bookings.py",
                "\nredis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[2])\n"
                "redis.call('EXPIRE', KEYS[3], ARGV[4])\n",
                "\nif ARGV[2] ~= '' then\n"
                "  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[2])\n"
                "  redis.call('EXPIRE', KEYS[3], ARGV[4])\n"
                "end\n",
            ),
            Edit(
                "infra/bookings.py",
                "        accepted = encode_entry(\n",
                '        accepted = "" if bench_switch.OFF else encode_entry(\n',
            ),
            Edit(
                "infra/bookings.py",
                "        entry = encode_entry(str(status), instance_id(), _final_fields(fields), at=now)\n",
                '        entry = "" if bench_switch.OFF else '
                "encode_entry(str(status), instance_id(), _final_fields(fields), at=now)\n",
            ),
            _reads_switch("infra/bookings.py", "import time\n"),
        ),
    ),
    Variant(
        "values-stream",
        "the runner's `values` stream (the final state it hands back)",
        (Edit("runs/runner.py", 'stream_mode=["updates", "values"]', 'stream_mode=["updates"]'),),
        switched=(
            Edit(
                "runs/runner.py",
                'stream_mode=["updates", "values"]',
                'stream_mode=["updates"] if bench_switch.OFF else ["updates", "values"]',
            ),
            _reads_switch("runs/runner.py"),
        ),
    ),
    Variant(
        "server-bounds",
        "the HTTP server's bounds (h11 with a header deadline and a 32 KiB header cap → uvicorn's httptools, "
        "which bounds neither; two stacks only: a process's server cannot be switched)",
        (Edit("infra/service/server.py", '"http": _protocol(settings),', '"http": "httptools",'),),
        in_all=False,
    ),
)
ALL = "all"
CONTROL = "control"
"""The copy unchanged (an A/A run): what the method itself reads as a difference, the floor under any row."""


def variant_edits(name: str) -> tuple[Edit, ...]:
    if name == ALL:
        return tuple(edit for variant in VARIANTS if variant.in_all for edit in variant.edits)
    if name == CONTROL:
        return ()
    return next(v.edits for v in VARIANTS if v.name == name)


def switched_edits(name: str) -> tuple[Edit, ...]:
    """``--one-stack``: the edits that put variant ``name``'s layer behind the switch (control: none)."""
    if name == CONTROL:
        return ()
    if name == ALL:  # a file two layers edit reads the switch once
        return tuple(dict.fromkeys(edit for v in VARIANTS if v.in_all for edit in v.switched or ()))
    edits = next((v.switched for v in VARIANTS if v.name == name), None)
    if edits is None:
        raise SystemExit(f"--one-stack: variant {name!r} has no switched form; run it on two stacks")
    return edits


def make_switched_tree(dest: Path, edits: Sequence[Edit]) -> None:
    """``make_tree`` plus the switch module, which every service imports (a SIGUSR1 would kill one that did not)."""
    make_tree(dest, (SWITCH_IMPORT, *edits))
    (dest / "bench_switch.py").write_text(SWITCH_MODULE)


def make_tree(dest: Path, edits: Sequence[Edit]) -> None:
    """This checkout's tracked files at ``dest`` (as in the working tree), with ``edits`` applied."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())
    for edit in edits:
        path = dest / edit.path
        text = path.read_text()
        if text.count(edit.old) != 1:
            raise SystemExit(
                f"{edit.path}: the text this variant replaces is found {text.count(edit.old)} times, not once; "
                f"update bench/layer_costs.py to the code:\n{edit.old}"
            )
        path.write_text(text.replace(edit.old, edit.new))


async def book(http: httpx.AsyncClient, count: int, factory: BookingFactory) -> tuple[list[str], list[float]]:
    """``count`` bookings one at a time on the stack ``http`` points at: their ids and latencies (POST → confirmed)."""
    result = await run_load(http, clients=1, stop=StopRule(confirmed=count), new_booking=factory, keep_ids=count)
    if result.errors:
        # a variant whose edits break bookings measures nothing: stop rather than report it
        raise RuntimeError(f"{http.base_url}: bookings did not confirm: {dict(result.errors)}")
    return result.confirmed_ids, result.confirmed_latencies_s()


@dataclass
class Sides:
    """Both sides' timed blocks (0: the code as it is, 1: the layer out), as ``compare`` and ``compare_switched``
    report them: the p50s, the median of the paired block differences, service CPU per booking."""

    cpu_s: list[float] = field(default_factory=lambda: [0.0, 0.0])
    times: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    block_p50: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    ids: list[str] = field(default_factory=list)

    async def timed_block(
        self, side: int, http: httpx.AsyncClient, block: int, factory: BookingFactory, pids: Sequence[int]
    ) -> list[str]:
        """``block`` bookings on ``http``, counted for ``side``: their latencies and the services' CPU."""
        cpu_before = sum(cpu_seconds(pid) for pid in pids)
        booked, latencies = await book(http, block, factory)
        self.cpu_s[side] += sum(cpu_seconds(pid) for pid in pids) - cpu_before
        self.times[side].extend(latencies)
        self.block_p50[side].append(statistics.median(latencies))
        if side == 0:
            self.ids.extend(booked)
        return booked

    def result(self) -> dict[str, Any]:
        diffs = [v - b for b, v in zip(*self.block_p50, strict=True)]
        return {
            "baseline_p50_ms": statistics.median(self.times[0]) * 1000,
            "variant_p50_ms": statistics.median(self.times[1]) * 1000,
            "paired_diff_p50_ms": statistics.median(diffs) * 1000,
            "baseline_cpu_ms": self.cpu_s[0] * 1000 / len(self.times[0]),
            "variant_cpu_ms": self.cpu_s[1] * 1000 / len(self.times[1]),
            "blocks": len(diffs),
            "baseline_booking_ids": self.ids[:20],
        }


def block_order(bookings: int, block: int) -> Iterator[int]:
    """The side of each block: pairs taking turns at going first (0 1, 1 0, 0 1, ...), so a drift hits both."""
    for i in range(max(1, bookings // block)):
        yield from (0, 1) if i % 2 == 0 else (1, 0)


async def compare(baseline: Stack, variant: Stack, bookings: int, block: int, seed: int) -> dict[str, Any]:
    """Bookings one at a time, in blocks of ``block`` on each stack in turn; latency and service CPU per booking.

    Blocks, not single bookings in turn: a booking right after one on the other stack runs with caches the other
    five processes filled, which adds milliseconds to both sides and blurs the figure each row compares with the
    bound. A block's first booking is not timed for the same reason.
    """
    factory = BookingFactory(seed)
    stacks = (baseline, variant)
    sides = Sides()
    async with (
        httpx.AsyncClient(base_url=baseline.url("booking-agent"), timeout=60) as baseline_http,
        httpx.AsyncClient(base_url=variant.url("booking-agent"), timeout=60) as variant_http,
    ):
        clients = (baseline_http, variant_http)
        for http in clients:  # warm-up: pools, caches, the first checkpoints of each service
            await book(http, 50, factory)
        for side in block_order(bookings, block):
            await book(clients[side], 1, factory)  # untimed: refills the caches the other stack used
            pids = [p.pid for p in stacks[side].services.values()]
            await sides.timed_block(side, clients[side], block, factory, pids)
    return sides.result()


async def compare_switched(
    stack: Stack, off_file: Path, bookings: int, block: int, seed: int, *, switches_journal: bool
) -> dict[str, Any]:
    """As ``compare``, on one stack whose layer is switched off and on between blocks (``--one-stack``).

    Two stacks differ by more than one layer: the same code on both reads a few milliseconds apart for the whole run
    (``--variants control``), different from run to run, which no alternation of blocks cancels. The same processes
    with the layer on and off have no such difference. The switch is flipped, then one untimed booking runs, then
    the block; the block's last booking's journal shows the switch was where it was meant to be.
    """
    factory = BookingFactory(seed)
    pids = [p.pid for p in stack.services.values()]
    sides = Sides()

    def switch(off: bool) -> None:
        if off:
            off_file.touch()
        else:
            off_file.unlink(missing_ok=True)
        for pid in pids:
            os.kill(pid, signal.SIGUSR1)

    async with httpx.AsyncClient(base_url=stack.url("booking-agent"), timeout=60) as http:
        for off in (False, True):  # warm-up: pools, caches, the first checkpoints, both ways
            switch(off)
            await book(http, 25, factory)
        for side in block_order(bookings, block):
            switch(side == 1)
            await book(http, 1, factory)  # untimed: every process has read the switch by its end
            booked = await sides.timed_block(side, http, block, factory, pids)
            journal = (await http.get(f"/bookings/{booked[-1]}/events")).json()["events"]
            if bool(journal) != (side == 0 or not switches_journal):
                state = "off" if side else "on"
                raise RuntimeError(f"the switch did not take: {len(journal)} journal entries with the layer {state}")
    return sides.result()


async def price_parts(baseline: Stack, booking_ids: Sequence[str]) -> dict[str, Any]:
    """The booking's unavoidable parts, priced as ``bench.booking_throughput`` prices them."""
    database = baseline.env["DATABASE_URL"]
    written = await checkpoints_written(database, booking_ids)
    with hop_pair() as pair:
        async with httpx.AsyncClient(timeout=30) as http:
            sampler = HopSampler(pair, http)
            for _ in range(5):
                await sampler.sample(200)
    writes = CheckpointSampler(database, booking_ids[0])
    async with writes.opened():
        await writes.sample(500)
    hop_ms = statistics.median(sampler.hop) * 1000
    direct_ms = statistics.median(sampler.direct) * 1000
    aput_ms = statistics.median(writes.times) * 1000
    batch_ms = statistics.median(writes.write_times) * 1000
    w, b = int(written["checkpoints"]), int(written["write_batches"])
    return {
        "hop_p50_ms": hop_ms,
        "direct_request_p50_ms": direct_ms,
        "aput_p50_ms": aput_ms,
        "aput_writes_p50_ms": batch_ms,
        "checkpoints": w,
        "write_batches": b,
        "unavoidable_ms": unavoidable_ms(
            hop_ms=hop_ms, direct_ms=direct_ms, aput_ms=aput_ms, writes_ms=batch_ms, checkpoints=w, write_batches=b
        ),
        "formula": f"{SERVICE_HOPS}·hop + {CLIENT_REQUESTS}·direct + {w}·aput + {b}·aput_writes",
    }


def report(rows: list[dict[str, Any]], parts: dict[str, Any]) -> None:
    unavoidable = parts["unavoidable_ms"]
    print(
        f"# what each layer costs one booking: {rows[0]['bookings']} bookings per side, one at a time, "
        "in blocks taking turns\n"
    )
    print(
        f"unavoidable parts = {parts['formula']} = {unavoidable:.1f} ms "
        f"(hop {parts['hop_p50_ms']:.2f}, direct {parts['direct_request_p50_ms']:.2f}, "
        f"aput {parts['aput_p50_ms']:.2f}, aput_writes {parts['aput_writes_p50_ms']:.2f}); "
        f"bound = {TARGET_LATENCY_FACTOR:g} × that = {TARGET_LATENCY_FACTOR * unavoidable:.1f} ms\n"
    )
    print("| without | baseline p50 ms | variant p50 ms | paired Δ ms | variant × parts | Δ service CPU ms |")
    print("|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {row['variant']} | {row['baseline_p50_ms']:.1f} | {row['variant_p50_ms']:.1f} | "
            f"{row['paired_diff_p50_ms']:+.2f} | {row['variant_p50_ms'] / unavoidable:.2f}× | "
            f"{row['variant_cpu_ms'] - row['baseline_cpu_ms']:+.2f} |"
        )
    print()
    for variant in VARIANTS:
        print(f"- {variant.name}: {variant.removes}")
    print(f"- {ALL}: every layer above at once")
    print(f"- {CONTROL}: nothing (the same code on both sides: the method's own difference)")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    names = [v.name for v in VARIANTS] + [ALL, CONTROL]
    parser = argparse.ArgumentParser(prog="python -m bench.layer_costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bookings", type=int, default=400, help="bookings per side and variant (default 400)")
    parser.add_argument(
        "--variants", default=",".join(names[:-1]), help=f"comma-separated, of {', '.join(names)} (all but control)"
    )
    parser.add_argument("--block", type=int, default=25, help="bookings per stack before switching (default 25)")
    parser.add_argument(
        "--one-stack",
        action="store_true",
        help="one stack per variant with its layer switched off and on between blocks, instead of two stacks "
        "(the way to measure a layer's cost below a few milliseconds: see compare_switched)",
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(args.variants) - set(names))
    if unknown or not args.variants:
        parser.error(f"--variants: unknown {unknown}; choose from {names}")
    if args.one_stack:
        switched = {v.name: v.switched for v in VARIANTS}
        unswitched = [n for n in args.variants if n not in (CONTROL, ALL) and switched.get(n) is None]
        if unswitched:
            parser.error(f"--one-stack: {unswitched} have no switched form")
    if args.block < 1 or args.bookings < 2 * args.block:
        parser.error("--bookings must be at least two --block's worth, and --block at least 1")
    return args


def run_one_stack(args: argparse.Namespace, loop: asyncio.AbstractEventLoop) -> tuple[list[dict[str, Any]], Any]:
    """Each variant on a stack of its own, its layer switched off and on between blocks."""
    rows: list[dict[str, Any]] = []
    parts: dict[str, Any] = {}
    for name in args.variants:
        with tempfile.TemporaryDirectory(prefix=f"concierge-{name}-") as tree:
            make_switched_tree(Path(tree), switched_edits(name))
            off_file = Path(tree) / "layer-off"
            env = {"PYTHONPATH": tree, "BENCH_LAYER_OFF_FILE": str(off_file)}
            print(f"[layer_costs] {name}: starting its stack (one stack, switched)", file=sys.stderr, flush=True)
            with service_stack(redis_url=args.redis_url, env=env) as stack:
                result = loop.run_until_complete(
                    compare_switched(
                        stack, off_file, args.bookings, args.block, args.seed, switches_journal=name in ("journal", ALL)
                    )
                )
                if not parts:
                    parts = loop.run_until_complete(price_parts(stack, result["baseline_booking_ids"]))
        rows.append({"variant": name, "bookings": args.bookings, "one_stack": True, **result})
        print(f"[layer_costs] {name}: {result['paired_diff_p50_ms']:+.2f} ms", file=sys.stderr, flush=True)
    return rows, parts


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    loop = new_event_loop()
    rows: list[dict[str, Any]] = []
    if args.one_stack:
        try:
            rows, parts = run_one_stack(args, loop)
        finally:
            loop.close()
        report(rows, parts)
        write_results(args.output, {"machine": machine(), "parts": parts, "variants": rows})
        return 0
    try:
        with contextlib.ExitStack() as cleanup:
            baseline = cleanup.enter_context(service_stack(redis_url=args.redis_url))
            for name in args.variants:
                tree = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix=f"concierge-{name}-")))
                make_tree(tree, variant_edits(name))
                print(f"[layer_costs] {name}: starting its stack", file=sys.stderr, flush=True)
                with service_stack(redis_url=args.redis_url, env={"PYTHONPATH": str(tree)}) as variant:
                    result = loop.run_until_complete(compare(baseline, variant, args.bookings, args.block, args.seed))
                rows.append({"variant": name, "bookings": args.bookings, **result})
                print(f"[layer_costs] {name}: {result['paired_diff_p50_ms']:+.2f} ms", file=sys.stderr, flush=True)
            parts = loop.run_until_complete(price_parts(baseline, rows[0]["baseline_booking_ids"]))
    finally:
        loop.close()
    report(rows, parts)
    write_results(args.output, {"machine": machine(), "parts": parts, "variants": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
