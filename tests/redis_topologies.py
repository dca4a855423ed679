"""Redis deployments as real processes for the high-availability tests and benches: a master with replicas and
three sentinels (``SentinelTopology``), a Redis Cluster (``ClusterTopology``). Free ports, a temp directory each,
everything killed on ``close()`` (or leaving the ``with``).

    with SentinelTopology() as redis:        # master, 1 replica, 3 sentinels watching "mymaster"
        stack = Stack(tmp, redis.url, ...)   # redis+sentinel://127.0.0.1:<s1>,.../mymaster/0
        redis.master.kill()                  # kill -9; the sentinels promote the replica
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis

from tests.procs import free_port

MASTER_NAME = "mymaster"
START_TIMEOUT_S = 30.0


class RedisProcess:
    """One ``redis-server`` (or sentinel) on a free port, in its own directory."""

    def __init__(self, workdir: Path, *args: str, sentinel: bool = False) -> None:
        self.port = free_port()
        self.workdir = workdir / f"{'sentinel' if sentinel else 'redis'}-{self.port}"
        self.workdir.mkdir(parents=True)
        exe = shutil.which("redis-server") or "redis-server"
        common = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.workdir), "--save", ""]
        if sentinel:
            # a sentinel rewrites its configuration file, so it must have one of its own
            config = self.workdir / "sentinel.conf"
            config.write_text("")
            argv = [exe, str(config), "--sentinel", *common[:4], "--dir", str(self.workdir), *args]
        else:
            argv = [exe, *common, "--appendonly", "no", *args]
        self.log = (self.workdir / "log").open("wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)
        self.client = redis.Redis(port=self.port, decode_responses=True, socket_timeout=2, socket_connect_timeout=2)
        wait_until(self._answers, f"redis on {self.port} answers PING")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _answers(self) -> bool:
        try:
            return bool(self.client.ping())
        except redis.RedisError:
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server on {self.port} exited: {self.log_text()}") from None
            return False

    def log_text(self) -> str:
        self.log.flush()
        return (self.workdir / "log").read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """``kill -9``."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def close(self) -> None:
        if self.alive:
            self.kill()
        self.client.close()
        self.log.close()


class SentinelTopology:
    """A master, ``replicas`` replicas and three sentinels (quorum 2) that fail over after ``down_after_ms``."""

    def __init__(self, *, replicas: int = 1, down_after_ms: int = 1000, failover_timeout_ms: int = 3000) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="concierge-sentinel-"))
        self.nodes: list[RedisProcess] = []
        self.sentinels: list[RedisProcess] = []
        try:
            self.master = self._node()
            self.replicas = [self._node("--replicaof", "127.0.0.1", str(self.master.port)) for _ in range(replicas)]
            wait_until(self._replicas_online, f"{replicas} replica(s) in sync")
            for _ in range(3):
                self.sentinels.append(RedisProcess(self.workdir, sentinel=True))
            for sentinel in self.sentinels:
                sentinel.client.execute_command("SENTINEL", "MONITOR", MASTER_NAME, "127.0.0.1", self.master.port, 2)
                for option, value in (
                    ("down-after-milliseconds", down_after_ms),
                    ("failover-timeout", failover_timeout_ms),
                ):
                    sentinel.client.execute_command("SENTINEL", "SET", MASTER_NAME, option, value)
            wait_until(self._sentinels_agree, "the sentinels know each other and the replicas")
        except BaseException:
            self.close()
            raise

    def _node(self, *args: str) -> RedisProcess:
        node = RedisProcess(self.workdir, *args)
        self.nodes.append(node)
        return node

    @property
    def url(self) -> str:
        return f"redis+sentinel://{','.join(s.address for s in self.sentinels)}/{MASTER_NAME}/0"

    def master_port(self) -> int | None:
        """The master's port as the first sentinel that answers sees it."""
        for sentinel in self.sentinels:
            try:
                address = sentinel.client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME)
            except redis.RedisError:
                continue
            return int(address[1]) if address else None
        return None

    def _replicas_online(self) -> bool:
        info = self.master.client.info("replication")
        online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
        return len(online) == len(self.replicas) and all(r.get("state") == "online" for r in online)

    def _sentinels_agree(self) -> bool:
        for sentinel in self.sentinels:
            state: Any = sentinel.client.sentinel_master(MASTER_NAME)
            if int(state["num-other-sentinels"]) != 2 or int(state["num-slaves"]) != len(self.replicas):
                return False
        return True

    def close(self) -> None:
        for process in [*self.sentinels, *self.nodes]:
            process.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class ClusterTopology:
    """``masters`` cluster nodes sharing the 16384 slots (``redis-cli --cluster create``), with ``replica_of``:
    one replica added to the master serving that key's slot."""

    def __init__(self, *, masters: int = 3, replica_of: str | None = None) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="concierge-cluster-"))
        self.nodes: list[RedisProcess] = []
        try:
            for _ in range(masters):
                self._node()
            cli = shutil.which("redis-cli") or "redis-cli"
            create = [cli, "--cluster", "create", *(n.address for n in self.nodes), "--cluster-replicas", "0"]
            subprocess.run([*create, "--cluster-yes"], check=True, capture_output=True, timeout=60)
            wait_until(self._ok, "cluster_state:ok on every node")
            if replica_of is not None:
                master = self.master_of(replica_of)
                replica = self._node()
                master_id = master.client.execute_command("CLUSTER", "MYID")
                add = [cli, "--cluster", "add-node", replica.address, master.address, "--cluster-slave"]
                subprocess.run([*add, "--cluster-master-id", master_id], check=True, capture_output=True, timeout=60)
                wait_until(lambda: _replica_count(master) == 1, "the replica in sync")
                wait_until(self._ok, "cluster_state:ok on every node")
        except BaseException:
            self.close()
            raise

    def _node(self) -> RedisProcess:
        # the cluster bus on a free port too (the default, port + 10000, may be taken or past 65535)
        cluster = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000"]
        node = RedisProcess(self.workdir, *cluster, "--cluster-port", str(free_port()))
        self.nodes.append(node)
        return node

    @property
    def url(self) -> str:
        return f"redis+cluster://{','.join(n.address for n in self.nodes)}/0"

    def master_of(self, key: str) -> RedisProcess:
        slot = int(self.nodes[0].client.execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, (_host, port, *_rest), *_replicas in self.nodes[0].client.execute_command("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return next(n for n in self.nodes if n.port == int(port))
        raise AssertionError(f"no node serves slot {slot}")

    def _ok(self) -> bool:
        return all("cluster_state:ok" in n.client.execute_command("CLUSTER", "INFO") for n in self.nodes)

    def close(self) -> None:
        for process in self.nodes:
            process.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _replica_count(node: RedisProcess) -> int:
    info = node.client.info("replication")
    return sum(
        1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict) and v.get("state") == "online"
    )


def wait_until(condition: Callable[[], bool], what: str, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if condition():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
