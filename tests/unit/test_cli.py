"""The ``concierge`` stack commands without a stack: argument checking, one-line failures, port plans, restart
backoff, the state file, status rendering and log streaming. No network; the few processes are local."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import io
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from domain.booking import BookingStatus
from infra.settings import get_settings
from stack.book import booking_body, steps_between
from stack.cli import COMMAND_REGISTRARS, build_parser, main, parser_for
from stack.down import stop_stack
from stack.errors import StackError, StackNotRunningError, UsageError
from stack.layout import parse_assignments, plan_fronts, plan_instances, select_instances
from stack.llm_faults import describe_llm_faults, llm_fault_body
from stack.logstream import LogStreamer
from stack.ops import fault_body, parse_when, wait_for_booking_status
from stack.redis_server import RedisPlan
from stack.services import DEFAULT_STACK, SERVICES, UnknownServiceError
from stack.state import (
    InstanceState,
    RedisState,
    StackPaths,
    StackSecrets,
    StackState,
    pid_alive,
    read_secrets,
    read_state,
    write_secrets,
    write_state,
)
from stack.status import StackReport, render_report
from stack.supervisor import RestartPolicy, SupervisorConfig, child_env, describe_exit
from tests.procs import serve_in_thread

SOON = dt.date.today() + dt.timedelta(days=40)


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("CONCIERGE_DATA_DIR", str(tmp_path / "data"))
    get_settings.cache_clear()
    yield tmp_path / "data"
    get_settings.cache_clear()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


# ---------------------------------------------------------------------------------------------- port plans


def test_default_plan_is_the_service_table() -> None:
    instances = plan_instances()
    assert [(i.name, i.port) for i in instances] == [(s.name, s.port) for s in DEFAULT_STACK.values()]


def test_port_base_shifts_every_port_and_port_overrides_one() -> None:
    instances = {i.name: i.port for i in plan_instances(port_base=18000, ports={"hotel-api": 29999})}
    assert instances["booking-agent"] == 18000
    assert instances["recovery-worker"] == 18020
    assert instances["hotel-api"] == 29999


def test_replicas_keep_the_first_port_and_take_consecutive_ones_after_the_stack() -> None:
    instances = plan_instances(scale={"booking-agent": 3, "search-agent": 2})
    ports = {i.name: i.port for i in instances}
    top = max(s.port for s in SERVICES.values())
    assert ports["booking-agent:1"] == SERVICES["booking-agent"].port
    assert sorted([ports["search-agent:2"], ports["booking-agent:2"], ports["booking-agent:3"]]) == [
        top + 1,
        top + 2,
        top + 3,
    ]
    assert ports["booking-agent:3"] == ports["booking-agent:2"] + 1
    assert len(set(ports.values())) == len(ports)


def test_a_scaled_service_gets_a_front_after_every_instance_and_its_peers_are_sent_there() -> None:
    instances = plan_instances(scale={"search-agent": 2, "booking-agent": 2})
    fronts = {f.service: f.port for f in plan_fronts(instances)}
    top = max(i.port for i in instances)
    assert fronts == {"search-agent": top + 1, "booking-agent": top + 2}
    assert plan_fronts(plan_instances()) == ()
    config = SupervisorConfig(
        paths=StackPaths.at("/nonexistent"),
        instances=instances,
        redis=RedisPlan(url="redis://127.0.0.1:1/0", own=False),
        command=("concierge",),
        base_env={},
        fronts=plan_fronts(instances),
    )
    env = child_env(config)
    assert env["SEARCH_AGENT_URL"] == f"http://127.0.0.1:{top + 1}"
    assert env["BOOKING_AGENT_URL"] == f"http://127.0.0.1:{top + 2}"
    assert env["PAYMENT_AGENT_URL"] == f"http://127.0.0.1:{SERVICES['payment-agent'].port}"  # one replica: itself


def test_colliding_or_impossible_ports_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="both use port 8001"):
        plan_instances(ports={"booking-agent": 8001})
    with pytest.raises(UsageError, match="out of range"):
        plan_instances(port_base=65530)
    with pytest.raises(UsageError, match="between 1 and"):
        plan_instances(scale={"booking-agent": 0})


def test_assignments_name_real_services_and_numbers() -> None:
    assert parse_assignments(["booking-agent=2"], option="--scale") == {"booking-agent": 2}
    with pytest.raises(UsageError, match="unknown service 'bookings'"):
        parse_assignments(["bookings=2"], option="--scale")
    with pytest.raises(UsageError, match="NAME=NUMBER"):
        parse_assignments(["booking-agent"], option="--scale")
    with pytest.raises(UsageError, match="not a whole number"):
        parse_assignments(["booking-agent=two"], option="--scale")


def test_targets_select_all_replicas_or_one() -> None:
    instances = plan_instances(scale={"booking-agent": 2})
    assert [i.name for i in select_instances(instances, "booking-agent")] == ["booking-agent:1", "booking-agent:2"]
    assert [i.name for i in select_instances(instances, "booking-agent:2")] == ["booking-agent:2"]
    with pytest.raises(UsageError, match="booking-agent runs as booking-agent:1, booking-agent:2"):
        select_instances(instances, "booking-agent:7")
    with pytest.raises(UnknownServiceError):
        select_instances(instances, "nope")


# ---------------------------------------------------------------------------------------------- restart policy


def test_backoff_doubles_per_crash_in_a_row_and_is_capped() -> None:
    policy = RestartPolicy(initial_s=0.5, factor=2, max_s=3, stable_after_s=30)
    assert [policy.delay(n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3, 3]


def test_a_child_that_ran_long_enough_starts_the_crash_count_again() -> None:
    policy = RestartPolicy(stable_after_s=30)
    assert policy.crashes_in_a_row(previous=4, ran_s=1.0) == 5
    assert policy.crashes_in_a_row(previous=4, ran_s=31.0) == 1


def test_exit_codes_read_as_people_say_them() -> None:
    assert describe_exit(-9) == "signal SIGKILL"
    assert describe_exit(1) == "code 1"


# ---------------------------------------------------------------------------------------------- one-line failures


@pytest.mark.parametrize("command", ["kill", "stop", "start"])
def test_unknown_service_is_one_line_and_exit_2(
    data_dir: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, _, err = run(capsys, command, "bookng-agent")
    assert code == 2
    assert "unknown service 'bookng-agent'" in one_line(err)
    assert "booking-agent" in err  # the valid names are listed


@pytest.mark.parametrize(
    "argv",
    [
        ("status",),
        ("kill", "booking-agent"),
        ("stop", "payment-api"),
        ("start", "payment-api"),
        ("down",),
    ],
)
def test_without_a_stack_every_command_says_so_in_one_line(
    data_dir: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 1
    assert "stack not running" in one_line(err)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--when", "booking:payin"), "unknown booking status 'payin'"),
        (("--when", "paying"), "--when must be booking:STATUS"),
        (("--when", "chat:paying"), "--when must be booking:STATUS"),
        (("--when", "booking:paying", "--timeout", "soon"), "--timeout must be a number"),
        (("--when", "booking:paying", "--timeout", "0"), "--timeout must be a positive number"),
        (("--when", "booking:paying", "--timeout", "nan"), "--timeout must be a positive number"),
        (("--timeout", "5"), "--timeout goes with --when"),
    ],
)
def test_kill_when_refuses_a_bad_condition_in_one_line_before_looking_for_a_stack(
    data_dir: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], says: str
) -> None:
    code, out, err = run(capsys, "kill", "booking-agent", *argv)
    assert code == 2, err
    assert says in one_line(err)
    assert "stack not running" not in err and out == ""
    if "status" in says:
        assert "paying" in err and "confirmed" in err  # the valid statuses are listed


def test_kill_when_without_a_stack_says_so_at_once(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # not after a 120 s wait for a booking that no stack will ever list
    code, _, err = run(capsys, "kill", "booking-agent", "--when", "booking:paying")
    assert code == 1
    assert "stack not running" in one_line(err)


def test_parse_when_takes_every_booking_status() -> None:
    for status in BookingStatus:
        assert parse_when(f"booking:{status.value}") is status


@pytest.fixture
def listing_agent(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[dict[str, str]]]]:
    """A booking-agent stand-in (real HTTP) whose ``GET /bookings?status=`` lists what the test puts in it."""
    from fastapi import FastAPI

    listed: dict[str, list[dict[str, str]]] = {}
    app = FastAPI()

    @app.get("/bookings")
    async def bookings(status: str, limit: int) -> dict[str, list[dict[str, str]]]:
        return {"bookings": listed.get(status, [])[:limit]}

    with serve_in_thread(app) as url:
        monkeypatch.setenv("BOOKING_AGENT_URL", url)
        get_settings.cache_clear()
        yield listed


def test_wait_for_booking_status_returns_once_a_booking_is_listed_at_it(
    listing_agent: dict[str, list[dict[str, str]]],
) -> None:
    listing_agent["confirmed"] = [{"booking_id": "bk-old"}]
    threading.Timer(0.3, lambda: listing_agent.update(paying=[{"booking_id": "bk-1"}])).start()
    assert wait_for_booking_status(BookingStatus.PAYING, timeout_s=60) == "bk-1"


def test_wait_for_booking_status_gives_up_at_its_deadline_and_says_what_it_saw(
    listing_agent: dict[str, list[dict[str, str]]],
) -> None:
    started = time.monotonic()
    with pytest.raises(StackError, match=r"no booking reached paying within 0.5 s \(no booking paying yet\)"):
        wait_for_booking_status(BookingStatus.PAYING, timeout_s=0.5)
    assert time.monotonic() - started >= 0.5  # a lower bound: it did wait


def test_a_stale_state_file_is_not_a_running_stack(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_state(StackPaths.at(data_dir), _state(supervisor_pid=dead.pid, pid=dead.pid))
    code, _, err = run(capsys, "status")
    assert code == 1 and "stack not running" in one_line(err)
    with pytest.raises(StackNotRunningError):
        stop_stack(StackPaths.at(data_dir))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--checkin", "2027-13-01"), "not a calendar date"),
        (("--checkin", "10/01/2027"), "YYYY-MM-DD"),
        (("--checkin", SOON.isoformat(), "--nights", "0"), "--nights must be at least 1"),
        (("--checkin", SOON.isoformat(), "--nights", "31"), "--nights must be at most 30"),
        (("--checkin", SOON.isoformat(), "--guests", "two"), "--guests must be a whole number"),
        (("--checkin", "2020-01-10"), "must not be in the past"),
        (("--checkin", "9999-12-30"), "must be within 730 days"),
    ],
)
def test_bad_booking_arguments_are_refused_before_any_request(
    data_dir: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, out, err = run(capsys, "book", "--city", "Lisbon", *argv)
    assert code == 2
    assert message in one_line(err)
    assert out == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("up", "--scale", "booking-agent=0"), "replicas must be between"),
        (("up", "--scale", "bookings=2"), "unknown service"),
        (("up", "--port-base", "65530"), "out of range"),
        (("up", "--port", "booking-agent=8001"), "both use port 8001"),
        (("fault", "booking-agent", "--latency", "1"), "takes no faults"),
        (("fault", "search-agent", "--error-rate", "0.5"), "search-agent takes --latency and --hang"),
        (("fault", "hotel-api", "--error-rate", "2"), "--error-rate must be between 0 and 1"),
        (("fault", "hotel-api", "--latency", "soon"), "--latency must be a number"),
        (("fault", "hotel-api", "--clear", "--hang"), "cannot be combined"),
        (("fault", "hotel-api", "--rpm", "10"), "--rpm is an llm-api option"),
        (("fault", "payment-api", "--model", "sim-large"), "--model is an llm-api option"),
        (("fault", "llm-api", "--model", "gpt-4"), "--model must be sim-large or sim-small"),
        (("fault", "llm-api", "--error-status", "418"), "--error-status: Input should be 429, 500, 502, 503 or 529"),
        (("fault", "llm-api", "--error-count", "0"), "--error-count: Input should be greater than or equal to 1"),
        (("fault", "llm-api", "--error-code", "Not A Code"), "--error-code: String should match pattern"),
        (("fault", "llm-api", "--retry-after", "soon"), "--retry-after must be a number"),
        (("fault", "llm-api", "--should-retry", "maybe"), "--should-retry must be true or false"),
        (("fault", "llm-api", "--cut-after-tokens", "1.5"), "--cut-after-tokens must be a whole number"),
        (("fault", "llm-api", "--malformed-tool-args", "yes"), "--malformed-tool-args: Input should be"),
        (("fault", "llm-api", "--token-delay", "inf"), "--token-delay must be a finite number"),
        (("fault", "llm-api", "--rpm", "0"), "--rpm: Input should be greater than or equal to 1"),
        (("fault", "llm-api", "--clear", "--hang"), "cannot be combined"),
        (("fault", "payment-api", "--price-change", "30"), "--price-change is a hotel-api option"),
        (("fault", "llm-api", "--name-suffix", "x"), "--name-suffix is a hotel-api option"),
        (("fault", "hotel-api", "--price-change", "201"), "--price-change must be between -50 and 200"),
        (("fault", "hotel-api", "--price-change", "-51"), "--price-change must be between -50 and 200"),
        (("fault", "hotel-api", "--price-change", "lots"), "--price-change must be a number"),
        (("fault", "hotel-api", "--name-suffix", "x" * 1001), "--name-suffix must be at most 1000 characters"),
        (("fault", "hotel-api", "--clear", "--price-change", "30"), "cannot be combined"),
        (("cancel", "no/such id"), "not a booking id"),
    ],
)
def test_bad_options_are_usage_errors(
    data_dir: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert message in one_line(err)


# ------------------------------------------------------------------- one command's parser, or every command's


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_command_is_named_once_and_listed_in_the_help() -> None:
    whole = _subparsers(build_parser())
    assert list(whole) == list(COMMAND_REGISTRARS)
    assert all(name in build_parser().format_help() for name in COMMAND_REGISTRARS)


@pytest.mark.parametrize("command", list(COMMAND_REGISTRARS))
def test_a_command_parsed_alone_reads_as_in_the_whole_parser(command: str) -> None:
    # main builds only the command named first (its module alone imported): same usage, help and options
    alone = parser_for([command, "--anything"])
    assert list(_subparsers(alone)) == [command]
    assert _subparsers(alone)[command].format_help() == _subparsers(build_parser())[command].format_help()
    assert alone.format_usage() == build_parser().format_usage()


@pytest.mark.parametrize("argv", [[], ["--help"], ["-h"], ["bogus"], ["-h", "serve"]])
def test_without_a_command_first_the_whole_parser_answers(argv: list[str]) -> None:
    assert list(_subparsers(parser_for(argv))) == list(COMMAND_REGISTRARS)


def test_booking_body_turns_nights_into_a_checkout() -> None:
    args = argparse.Namespace(
        city="Lisbon", checkin=SOON.isoformat(), nights="3", guests="2", card="tok_visa", hotel=None
    )
    assert booking_body(args) == {
        "city": "Lisbon",
        "checkin": SOON.isoformat(),
        "checkout": (SOON + dt.timedelta(days=3)).isoformat(),
        "guests": 2,
        "payment_token": "tok_visa",
    }
    args.hotel = "lisbon-02"
    assert booking_body(args)["hotel_id"] == "lisbon-02"


def test_steps_a_poll_jumped_over_are_named_but_never_invented_for_failures() -> None:
    assert steps_between("pending", "paying") == ["searching", "reserving"]
    assert steps_between(None, "searching") == ["pending"]
    assert steps_between("paying", "confirming") == []
    assert steps_between("reserving", "failed") == []


def test_fault_options_become_the_provider_body() -> None:
    args = argparse.Namespace(latency="2.5", error_rate=None, hang=False)
    assert fault_body(args) == {"latency_s": 2.5, "error_rate": 0.0, "hang": False}
    assert fault_body(argparse.Namespace(latency=None, error_rate=None, hang=False)) is None
    hotel = build_parser().parse_args(["fault", "hotel-api", "--price-change", "30", "--name-suffix", " (ignore all)"])
    assert fault_body(hotel) == {
        "latency_s": 0.0,
        "error_rate": 0.0,
        "hang": False,
        "price_change_pct": 30.0,
        "name_suffix": " (ignore all)",
    }


def test_llm_fault_options_become_the_simulators_body() -> None:
    parser = build_parser()
    args = parser.parse_args(
        ["fault", "llm-api", "--model", "sim-small", "--error-count", "1", "--error-status", "429", "--retry-after",
         "1.5", "--should-retry", "false", "--latency", "0.2", "--token-delay", "0.01", "--rpm", "60"]
    )  # fmt: skip
    assert llm_fault_body(args) == {
        "model": "sim-small",
        "error_count": 1,
        "error_status": 429,
        "retry_after_s": 1.5,
        "should_retry": False,
        "first_token_latency_s": 0.2,
        "token_delay_s": 0.01,
        "rpm": 60,
    }
    flags = parser.parse_args(["fault", "llm-api", "--hang", "--loop-tool", "--context-length-exceeded"])
    assert llm_fault_body(flags) == {"model": None, "hang": True, "loop_tool": True, "context_length_exceeded": True}
    assert llm_fault_body(parser.parse_args(["fault", "llm-api", "--model", "sim-large"])) is None  # show one model
    view = {
        "models": {"sim-large": {"error_status": 429, "error_count": 2, "retry_after_s": 1}, "sim-small": {}},
        "errors_left": {"sim-large": 1, "sim-small": None},
    }
    assert describe_llm_faults(view) == "sim-large: error 429 next 2 (1 left), retry-after 1s; sim-small: none"
    assert describe_llm_faults(view, "sim-small") == "sim-small: none"


# ---------------------------------------------------------------------------------------------- state


def _state(*, supervisor_pid: int, pid: int | None, restarts: int = 0) -> StackState:
    instance = InstanceState(
        name="booking-agent",
        service="booking-agent",
        replica=1,
        port=8000,
        url="http://127.0.0.1:8000",
        health_path="/health",
        ready_path="/health/ready",
        status="up" if pid else "backoff",
        pid=pid,
        restarts=restarts,
        started_at=time.time() - 75 if pid else None,
    )
    return StackState(
        supervisor_pid=supervisor_pid,
        phase="ready",
        started_at=time.time() - 125,
        socket="/nonexistent.sock",
        redis=RedisState(url="redis://127.0.0.1:6379/0", own=False),
        checkpointer="sqlite x",
        instances=(instance,),
    )


def test_state_survives_a_round_trip_through_the_file(tmp_path: Path) -> None:
    paths = StackPaths.at(tmp_path)
    assert read_state(paths) is None
    state = _state(supervisor_pid=os.getpid(), pid=123, restarts=2)
    write_state(paths, state)
    assert read_state(paths) == state
    assert state.pids() == [123, os.getpid()]


def test_a_deep_data_dir_still_gets_a_usable_socket_path(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    socket_path = StackPaths.at(deep).socket
    assert len(os.fsencode(socket_path)) <= 100
    assert socket_path != StackPaths.at(tmp_path).socket


def test_zombies_and_reaped_processes_are_not_alive() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    # exited but not yet reaped: a zombie, which must count as gone
    while pid_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not pid_alive(child.pid)
    child.wait()
    assert not pid_alive(child.pid)


# ---------------------------------------------------------------------------------------------- rendering


def test_status_shows_restarts_open_breakers_queue_and_bookings() -> None:
    report = StackReport(
        state=_state(supervisor_pid=4242, pid=777, restarts=3),
        in_flight=5,
        circuits={"booking-agent": {"hotel_api": {"state": "open", "failures": 7, "seconds_until_retry": 4.2}}},
        bulkheads={"booking-agent": {"booking_agent": {"in_use": 2, "max": 10, "waiting": 1, "rejected": 0}}},
        queue={"recovery-worker": {"depth": 4, "max_size": 100, "dlq_depth": 2, "in_flight": 1, "oldest_age_s": 1.5}},
    )
    text = render_report(report)
    row = next(line for line in text.splitlines() if line.startswith("booking-agent ") and "777" in line)
    assert row.split()[:5] == ["booking-agent", "up", "777", "3", "1m15s"]
    assert "hotel_api" in text and "open" in text and "4.2s" in text
    assert "2/10" in text
    assert "depth 4/100" in text and "DLQ 2" in text
    assert "in flight 5" in text


def test_status_names_the_runs_that_wait_for_a_graph_version() -> None:
    line = "2 run(s) wait for graph version booking@1, which no running process runs: a, b (docs/upgrades.md)"
    report = StackReport(state=_state(supervisor_pid=4242, pid=777), in_flight=2, waiting=[line])
    assert f"waiting          {line}" in render_report(report).splitlines()
    assert report.to_json()["waiting_for_versions"] == [line]


def test_fronts_are_kept_in_the_state_and_shown_by_status(tmp_path: Path) -> None:
    paths = StackPaths.at(tmp_path)
    state = dataclasses.replace(
        _state(supervisor_pid=os.getpid(), pid=123), fronts={"search-agent": "http://127.0.0.1:8025"}
    )
    write_state(paths, state)
    assert read_state(paths) == state
    text = render_report(StackReport(state=state, in_flight=0))
    assert "front of search-agent: http://127.0.0.1:8025" in text


def test_status_marks_what_did_not_answer() -> None:
    report = StackReport(
        state=_state(supervisor_pid=4242, pid=777),
        in_flight=None,
        in_flight_error="ConnectionError: refused",
        circuits={"booking-agent": "unreachable (ConnectError)"},
    )
    text = render_report(report)
    assert "unreachable (ConnectError)" in text
    assert "no recovery-worker running" in text
    assert "in flight unknown (ConnectionError: refused)" in text


def test_log_streaming_prefixes_lines_and_never_replays_old_ones(tmp_path: Path) -> None:
    log = tmp_path / "hotel-api.log"
    log.write_text("from an earlier run\n")
    out = io.StringIO()
    streamer = LogStreamer([("hotel-api", log), ("booking-agent", tmp_path / "missing.log")], out=out)
    with log.open("a") as fh:
        fh.write("started\nhalf a li")
    streamer.pump()
    with log.open("a") as fh:
        fh.write("ne\n")
    streamer.pump()
    assert out.getvalue().splitlines() == ["hotel-api     | started", "hotel-api     | half a line"]


# ---------------------------------------------------------------------------------------------- secrets


def test_state_and_secrets_files_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    paths = StackPaths.at(tmp_path / "data")
    old_umask = os.umask(0o022)  # what a shell usually has: new files world-readable
    try:
        write_state(paths, _state(supervisor_pid=os.getpid(), pid=123))
        write_secrets(paths, StackSecrets(service_secret="s" * 64, admin_token="a" * 32))
    finally:
        os.umask(old_umask)
    for path in (paths.state_file, paths.secrets_file):
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert read_secrets(paths) == StackSecrets(service_secret="s" * 64, admin_token="a" * 32)
    assert "s" * 64 not in paths.state_file.read_text()  # the snapshot others may be shown holds no secret
    assert "s" * 64 not in repr(read_secrets(paths))


def test_up_takes_the_secrets_from_the_environment_or_makes_new_ones() -> None:
    generated = StackSecrets.from_env_or_new({})
    assert len(generated.service_secret) >= 32 and generated.admin_token
    assert generated != StackSecrets.from_env_or_new({})  # never a value another install shares
    assert generated.llm_api_key and generated.llm_api_key != StackSecrets.generate().llm_api_key
    chosen = StackSecrets.from_env_or_new(
        {"CONCIERGE_SERVICE_SECRET": "x" * 40, "CONCIERGE_ADMIN_TOKEN": "adm", "LLM_API_KEY": "sk-mine"}
    )
    assert (chosen.service_secret, chosen.admin_token, chosen.llm_api_key) == ("x" * 40, "adm", "sk-mine")


def test_every_child_of_up_gets_the_stack_secrets(tmp_path: Path) -> None:
    stack_secrets = StackSecrets.generate()
    config = SupervisorConfig(
        paths=StackPaths.at(tmp_path),
        instances=plan_instances(),
        redis=RedisPlan(url="redis://127.0.0.1:6379/0", own=False),
        command=("concierge",),
        base_env={"CONCIERGE_SERVICE_SECRET": "from-the-parent"},
        secrets=stack_secrets,
    )
    env = child_env(config)
    assert env["CONCIERGE_SERVICE_SECRET"] == stack_secrets.service_secret
    assert env["CONCIERGE_ADMIN_TOKEN"] == stack_secrets.admin_token
    assert env["LLM_API_KEY"] == stack_secrets.llm_api_key


def test_serve_without_a_secret_refuses_in_one_line(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CONCIERGE_SERVICE_SECRET", raising=False)
    get_settings.cache_clear()
    code, out, err = run(capsys, "serve", "search-agent")
    assert code == 1
    line = one_line(err)
    assert line.startswith("concierge serve search-agent: CONCIERGE_SERVICE_SECRET is not set")
    assert out == ""


def test_up_refuses_an_unusable_secret_from_the_environment_at_once(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CONCIERGE_SERVICE_SECRET", "concierge-dev-token")
    get_settings.cache_clear()
    code, _, err = run(capsys, "up")
    assert code == 1
    assert "well-known value" in one_line(err)
