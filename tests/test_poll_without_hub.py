"""Before every command on a pooled connection redis-py asks whether it holds anything
unread (and httpcore2, before it reuses a connection to the model server, whether the server
closed it). In a gevent worker that check went through the event loop (27 us of CPU a command
against 1 us for the poll(2) it stands for); it is answered by the system's poll now, and a
connection holding a reply nobody read, or one the server closed, is still found and
replaced before a command is sent on it."""

from __future__ import annotations

import json
import subprocess
import sys

from switchboard import redisconn
from tests.support.processes import ROOT

SCRIPT = r"""
import json, sys
from gevent import monkey

monkey.patch_all()
import select

import redis

from switchboard import redisconn

through_hub = 0
hubs_poll = select.poll


class CountedPoll(hubs_poll):
    def __init__(self):
        global through_hub
        through_hub += 1
        super().__init__()


select.poll = CountedPoll
client = redisconn.connect(sys.argv[1])
client.set("k", "v")
through_hub = 0
for _ in range(50):
    assert client.get("k") == b"v"
idle = through_hub

system_poll = monkey.get_original("select", "poll")


def arrived(connection):
    # wait until what the server sent (a reply, or its close) has reached the socket
    poller = system_poll()
    poller.register(connection._sock.fileno(), select.POLLIN)
    assert poller.poll(10_000)


pool = client.connection_pool
held = pool.get_connection()
held.send_command("PING")  # its reply left unread, as a command cut off would leave it
arrived(held)
pool.release(held)
after_unread = client.get("k")

held = pool.get_connection()
held.send_command("CLIENT", "ID")
held_id = held.read_response()
redis.Redis.from_url(sys.argv[1]).client_kill_filter(_id=held_id)
arrived(held)
pool.release(held)
after_close = client.get("k")
import socket

import httpcore2

from worker.model_http import OneWriteStream

ours, theirs = socket.socketpair()
stream = OneWriteStream(httpcore2._backends.sync.SyncStream(ours))
through_hub = 0
kept = [stream.get_extra_info("is_readable") for _ in range(50)]
model_idle = through_hub
theirs.close()
closed_seen = stream.get_extra_info("is_readable")
print(json.dumps({"idle": idle, "unread": after_unread.decode(), "closed": after_close.decode(),
                  "model_idle": model_idle, "model_kept": not any(kept),
                  "model_closed_seen": closed_seen}))
"""


def test_a_gevent_process_checks_its_idle_connections_without_the_event_loop(redis_url):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, redis_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["idle"] == 0  # 50 commands, none of their checks through gevent's poll
    assert said["unread"] == "v"  # not the PING's PONG: that connection was replaced
    assert said["closed"] == "v"  # a connection the server closed: replaced too
    # the model server's connections too (worker/model_http.py), before each reuse
    assert said["model_idle"] == 0 and said["model_kept"]
    assert said["model_closed_seen"] is True


def test_a_connection_whose_socket_was_closed_under_it_is_opened_again(redis_url):
    """Threads mode: another thread closed the socket between the pool's hand-out and the
    check (redis-py says so as a connection error, and the pool opens it again)."""
    client = redisconn.connect(redis_url)
    held = client.connection_pool.get_connection()
    held._sock.close()
    client.connection_pool.release(held)
    assert client.ping() is True
