"""A plain REDIS_URL whose server is demoted to a replica under a run: how a managed Redis
(ElastiCache, Memorystore, Azure) fails over. Its DNS name moves to the promoted replica,
but open connections stay with the old primary, which answers every write READONLY. The
workers leave such a connection (a new one resolves the name again) and take the answer as
Redis being unavailable for now: the run in flight goes on from its last save once a
primary answers; before, its save failed it and RQ's slot quit. Here the server is demoted
and then promoted again, so the URL leads to a primary again, as the moved name would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis

from switchboard.redisconn import PrimaryMoved, connect, unavailable
from tests.fakes.openai_server import Turn
from tests.support.processes import WorkerProcess, logged, worker_env
from tests.support.redis_server import RedisServer, free_port
from tests.support.runtime import ALICE, make_runtime, wait_until
from worker import service
from worker.run import RunStatus

pytestmark = pytest.mark.slow


PASSWORD = "demoted-s3cret"


def test_a_run_whose_primary_is_demoted_under_it_goes_on_once_a_primary_answers(
    tmp_path: Path, model_server
):
    server = RedisServer(tmp_path / "redis").start()
    admin = redis.Redis(unix_socket_path=server.socket)
    conn = connect(server.url)
    question = "what does the demoted primary say"
    model_server.route(question, [Turn(text="the answer", delay=1.5)])
    env = worker_env(server.url, model_server.url, tmp_path)
    worker = WorkerProcess(env, tmp_path / "worker.log", "--concurrency", "2")
    try:
        rt = make_runtime(conn, model_server.url)
        run = service.submit(rt, question, ALICE)
        model_server.wait_for(lambda: any(question in str(r) for r in model_server.chat_requests))
        # demoted: a replica of a primary that is not there (it keeps its data, and reads)
        admin.replicaof("127.0.0.1", free_port())
        with pytest.raises(PrimaryMoved):  # a write, after the retries on new connections
            conn.set("sb:test:write", "1")
        wait_until(lambda: logged(worker.log, "advance_interrupted"), timeout=60)
        assert rt.store.load(run.id).status == RunStatus.RUNNING  # as last saved, not failed
        admin.replicaof("NO", "ONE")  # a primary answers at the URL again

        def ended() -> bool:
            return rt.store.load(run.id).status.terminal

        wait_until(ended, timeout=60, what="the run to end")
        done = rt.store.load(run.id)
        assert done.status == RunStatus.COMPLETED and done.answer == "the answer", done
        assert worker.proc.poll() is None  # the worker carried on: not quit, not restarted
        assert not logged(worker.log, "advance_failed")
    finally:
        worker.stop()
        admin.replicaof("NO", "ONE")
        admin.close()
        conn.close()
        server.stop()


def test_other_errors_of_a_primary_are_raised_as_they_are_not_taken_for_a_demotion(
    tmp_path: Path,
):
    server = RedisServer(tmp_path / "redis").start()
    conn = connect(server.url)
    try:
        conn.set("sb:test:text", "v")
        for command in (
            lambda: conn.lpush("sb:test:text", "1"),
            lambda: conn.eval("return redis.call('LPUSH', KEYS[1], 1)", 1, "sb:test:text"),
            lambda: conn.eval("return redis.error_reply('ERR READONLY, a word of its own')", 0),
        ):
            with pytest.raises(redis.ResponseError) as raised:
                command()
            assert not isinstance(raised.value, PrimaryMoved | redis.ConnectionError)
        assert conn.get("sb:test:text") == b"v"  # the connection still serves
    finally:
        conn.close()
        server.stop()


def connections_received(admin: redis.Redis) -> int:
    return int(admin.info("stats")["total_connections_received"])


def test_a_name_moved_to_the_promoted_replica_is_followed_by_writes_and_reads(tmp_path: Path):
    """The managed failover itself, its DNS name played by a socket's symlink: the write
    refused by the demoted primary is sent again on a new connection, which reaches the new
    one; no connection the pool hands out afterwards reads the old one, which here cannot
    reach the new primary and keeps its stale data (found by review)."""
    old = RedisServer(tmp_path / "old", password=PASSWORD).start()
    new = RedisServer(tmp_path / "new", password=PASSWORD).start()
    name = tmp_path / "name.sock"
    name.symlink_to(old.socket)
    old_admin = redis.Redis(unix_socket_path=old.socket, password=PASSWORD)
    new_admin = redis.Redis(unix_socket_path=new.socket, password=PASSWORD)
    conn = connect(f"unix://{name}?password={PASSWORD}")
    try:
        new_admin.config_set("masterauth", PASSWORD)
        new_admin.replicaof("127.0.0.1", old.port)
        conn.set("sb:test:value", "before")
        wait_until(lambda: new_admin.get("sb:test:value") == b"before", timeout=30)
        pool = conn.connection_pool
        held = [pool.get_connection() for _ in range(3)]  # three open to the old primary
        for connection in held:
            pool.release(connection)
        # the failover: the replica promoted, the old primary demoted (cut off: it keeps
        # its data), the name moved
        new_admin.replicaof("NO", "ONE")
        old_admin.replicaof("127.0.0.1", free_port())
        name.unlink()
        name.symlink_to(new.socket)

        conn.set("sb:test:value", "after")  # refused by the old one, sent again: the new one
        assert new_admin.get("sb:test:value") == b"after"
        before = connections_received(new_admin)
        held = [pool.get_connection() for _ in range(3)]
        # the two left with the old one are opened again, and only they: the retry's own
        # socket was once left marked as older than the demotion, and opened a third time
        assert connections_received(new_admin) - before == 2
        try:
            for connection in held:  # whichever the pool hands out reads the new primary
                connection.send_command("GET", "sb:test:value")
                assert connection.read_response() == b"after"
        finally:
            for connection in held:
                pool.release(connection)
        ours = f"switchboard-{os.getpid()}"
        assert not [c for c in old_admin.client_list() if c.get("name") == ours]
    finally:
        conn.close()
        old_admin.close()
        new_admin.close()
        old.stop()
        new.stop()


def test_a_demoted_primarys_answer_to_a_batch_that_could_repeat_itself_is_not_sent_again(
    tmp_path: Path,
):
    """Sent again, a batch that is not a transaction could repeat the commands before the
    refused one, and a transaction with keys watched became WatchError, which RQ retries at
    once: 2,683 new connections in 2 s (found by review). Both are said as an outage, after
    one try; a plain transaction, which runs whole or not at all, and a batch refused from
    its first reply, of which nothing ran, are sent again."""
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    admin = redis.Redis(unix_socket_path=server.socket, password=PASSWORD)
    conn = connect(server.url)
    try:
        conn.set("sb:test:value", "v")
        admin.replicaof("127.0.0.1", free_port())  # demoted
        batch = conn.pipeline(transaction=False)
        batch.get("sb:test:value").incr("sb:test:count")
        watched = conn.pipeline()
        watched.watch("sb:test:value")
        assert watched.get("sb:test:value") == b"v"
        watched.multi()
        watched.set("sb:test:value", "w")
        for pipe in (batch, watched):
            before = connections_received(admin)
            with pytest.raises(redis.ConnectionError) as raised:
                pipe.execute()
            assert not isinstance(raised.value, PrimaryMoved)  # not retried by the client
            said = str(unavailable(server.url, raised.value, temporary=False))
            assert said.startswith("Redis is a replica, not the primary"), said
            assert connections_received(admin) - before <= 1  # one try: no retries
        for pipe in (  # sent again: a plain transaction; a batch refused from its first reply
            conn.pipeline().set("sb:test:value", "t"),
            conn.pipeline(transaction=False).incr("sb:test:count").get("sb:test:value"),
        ):
            before = connections_received(admin)
            with pytest.raises(PrimaryMoved):
                pipe.execute()
            assert connections_received(admin) - before >= 3
    finally:
        admin.replicaof("NO", "ONE")
        admin.close()
        conn.close()
        server.stop()
