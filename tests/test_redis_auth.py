"""Redis with a password (`requirepass`) and with TLS (`rediss://`), as deployments run it:
the connection the CLI opens, a worker process, RQ's scheduler, and a whole run over it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from switchboard.errors import RedisUnavailable
from switchboard.redisconn import connect
from tests.fakes.openai_server import Turn
from tests.support.processes import WorkerProcess, worker_env
from tests.support.redis_server import RedisServer, TLSFiles, tls_binary
from tests.support.runtime import ALICE, approve_first, make_runtime, wait_until, work
from tools.builtin.tickets import TicketStore
from tools.exceptions import OperatorError
from worker import service
from worker.run import RunStatus

PASSWORD = "s3cret0f24hexchars"
CREATE = Turn(tool_calls=[("create_ticket", {"project": "IT", "title": "Printer jam"})])


@pytest.fixture
def protected(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis", password=PASSWORD).start()
    yield server
    server.stop()


def test_a_password_in_redis_url_reaches_redis_and_a_wrong_one_is_one_clear_line(protected):
    url = protected.url
    assert url == f"redis://:{PASSWORD}@127.0.0.1:{protected.port}/0"
    conn = connect(url)
    assert conn.ping()
    conn.close()

    for wrong in (url.replace(PASSWORD, "nope"), url.replace(f":{PASSWORD}@", "")):
        with pytest.raises(OperatorError) as refused:
            connect(wrong)
        said = str(refused.value)
        assert "Redis refused the connection" in said and "REDIS_URL=" in said
        assert "redis://USER:PASSWORD@HOST:6379/0" in said  # how to fix it
    assert PASSWORD not in said and "nope" not in said  # never prints a password


@pytest.mark.slow
def test_a_worker_process_carries_a_run_through_an_approval_on_a_password_protected_redis(
    protected, model_server, tmp_path
):
    model_server.route("Printer", [CREATE, "Filed ticket #1 for the printer jam."])
    conn = connect(protected.url)
    rt = make_runtime(conn, model_server.url)
    env = worker_env(protected.url, model_server.url, tmp_path)
    worker = WorkerProcess(env, tmp_path / "worker.log")
    try:
        run = service.submit(rt, "Printer jam on floor 2, file a ticket", ALICE)
        wait_until(
            lambda: rt.store.load(run.id).status == RunStatus.AWAITING_APPROVAL,
            what="the worker to suspend the run",
        )
        # the worker scheduled the approval's expiry with RQ over the same URL
        [approval_id] = rt.store.load(run.id).pending_approvals
        assert rt.queue.scheduled_job_registry.get_job_ids() == [rt.expiry_job_id(approval_id)]
        approve_first(rt, run.id)
        wait_until(lambda: rt.store.load(run.id).status.terminal, what="the run to end")
    finally:
        worker.stop()
    run = rt.store.load(run.id)
    assert run.status == RunStatus.COMPLETED, (run.detail, worker.log.read_text()[-2000:])
    assert TicketStore(tmp_path / "tickets.sqlite3").count_executions("create_ticket") == 1
    conn.close()


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[RedisServer]:
    binary = tls_binary()
    if binary is None:
        pytest.skip("no redis-server built with TLS here (Debian's redis-server is)")
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    folder = tmp_path / "tls"
    folder.mkdir()
    files = TLSFiles(cert=folder / "server.pem", key=folder / "server.key", ca=folder / "ca.pem")
    cert.cert_chain_pems[0].write_to_path(str(files.cert))
    cert.private_key_pem.write_to_path(str(files.key))
    ca.cert_pem.write_to_path(str(files.ca))
    server = RedisServer(tmp_path / "redis", password=PASSWORD, tls=files, binary=binary)
    yield server.start()
    server.stop()


def test_rediss_with_the_servers_ca_carries_a_whole_run(tls_server, model_server, tickets_db):
    url = tls_server.url
    assert url.startswith(f"rediss://:{PASSWORD}@127.0.0.1:") and "ssl_ca_certs=" in url
    model_server.route("2 + 3", [Turn(tool_calls=[("calculate", {"expression": "2 + 3"})]), "5."])
    conn = connect(url)
    assert conn.connection_pool.connection_kwargs["ssl_ca_certs"].endswith("ca.pem")
    rt = make_runtime(conn, model_server.url)
    run = service.submit(rt, "what is 2 + 3?", ALICE)
    work(rt)  # RQ's worker over the same TLS connection
    assert rt.store.load(run.id).status == RunStatus.COMPLETED
    conn.close()


def test_rediss_checks_the_servers_certificate(tls_server):
    unverified = tls_server.url.split("?")[0]  # the system's CAs do not know this server
    with pytest.raises(OperatorError, match="cannot reach Redis") as refused:
        connect(unverified)
    assert "certificate" in str(refused.value).lower()
    started = time.monotonic()
    with pytest.raises(OperatorError, match="certificate") as lasting:  # no wait mends it
        connect(unverified, wait=60)
    assert time.monotonic() - started < 15  # said at once
    assert not isinstance(lasting.value, RedisUnavailable)  # exit status 2, not 75
    plain = unverified.replace("rediss://", "redis://")  # no TLS at all: the server hangs up
    with pytest.raises((OperatorError, redis.RedisError)):
        connect(plain)
