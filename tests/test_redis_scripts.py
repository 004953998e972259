"""Scripts run wherever their command lands (switchboard.redisconn.AnyServerScript). During a
failover a connection pool holds connections to two servers: redis-py's answer to NOSCRIPT
(load the script, send EVALSHA again) can load it on one and run it on the other, which
answers NOSCRIPT again; the chaos soak's stopping worker lost its hand-back to that. Against
two real Redis servers and a pool that hands out their connections in turn."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.commands.core import Script

from switchboard.redisconn import AnyServerScript, Client
from tests.support.redis_server import RedisServer

INCR = "return redis.call('INCR', KEYS[1])"


class InTurn(redis.ConnectionPool):
    """Connections to two servers in turn, as a pool's are while a failover moves it: some
    still open to the demoted primary, new ones to the promoted replica."""

    def __init__(self, first: str, second: str) -> None:
        self.pools = [redis.ConnectionPool.from_url(u) for u in (first, second)]
        template = self.pools[0]
        super().__init__(connection_class=template.connection_class, **template.connection_kwargs)
        self.turn = itertools.count()
        self.lent: dict[int, redis.ConnectionPool] = {}

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        pool = self.pools[next(self.turn) % 2]
        connection = pool.get_connection()
        self.lent[id(connection)] = pool
        return connection

    def release(self, connection: Any) -> None:
        self.lent.pop(id(connection)).release(connection)

    def disconnect(self, inuse_connections: bool = True) -> None:
        for pool in self.pools:
            pool.disconnect(inuse_connections)


@pytest.fixture
def second_server(tmp_path: Path) -> Iterator[str]:
    server = RedisServer(tmp_path / "second").start()
    yield server.url
    server.stop()


def test_a_script_loaded_on_one_server_and_run_on_another_runs_all_the_same(
    redis_url: str, second_server: str
) -> None:
    client = Client(connection_pool=InTurn(redis_url, second_server))
    client.script_flush()  # neither server has it (the flush went to one; its turn ends)
    client.script_flush()
    plain = Script(client, INCR)  # redis-py's own: EVALSHA, SCRIPT LOAD, EVALSHA
    with pytest.raises(redis.exceptions.NoScriptError):
        plain(keys=["sb:test:counter"])  # the EVALSHAs reach the server the load did not
    client.script_flush()
    client.script_flush()
    ours = client.register_script(INCR)
    assert isinstance(ours, AnyServerScript)
    assert ours(keys=["sb:test:counter"]) == 1  # its text sent at last: it ran where it landed
    client.connection_pool.disconnect()
    counts = [redis.Redis.from_url(u).getdel("sb:test:counter") for u in (redis_url, second_server)]
    assert counts.count(b"1") == 1 and counts.count(None) == 1  # it ran once, on one server


def test_the_connection_every_process_opens_is_one_whose_scripts_run_anywhere(redis_url: str):
    """REDIS_URL's (redis+sentinel://: tests/test_redis_sentinel.py)."""
    from switchboard.redisconn import connect

    assert isinstance(connect(redis_url).register_script(INCR), AnyServerScript)
