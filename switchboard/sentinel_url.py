"""`redis+sentinel://` URLs: the Redis primary that Sentinel names, found again after a failover.

    redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[/DB][?sentinel_password=P]

The hosts are the Sentinels (26379 when a port is left out), SERVICE the name they monitor
the primary under (`sentinel monitor SERVICE ...`), DB the database (0). The user and password
are the primary's (and its replicas'); `sentinel_password` (and `sentinel_username`) those of
the Sentinels themselves, when they require one. redis-py's `redis.sentinel.Sentinel` does the
rest: it asks the Sentinels for the primary on every new connection, and a connection to a
demoted primary is dropped on its first READONLY answer.

A URL with several hosts does not split with `urllib` (its port is "26379,host2:26379"),
so this module parses it; the settings check it at start-up and `errors.redact_url` uses it to
hide the passwords.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, unquote

SCHEME = "redis+sentinel"
DEFAULT_PORT = 26379
MAX_SENTINELS = 16  # a quorum needs 3 or 5; more is a typo or a pasted list
MAX_LENGTH = 2048
QUERY_KEYS = ("sentinel_password", "sentinel_username")
_SERVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_HOST = re.compile(r"[A-Za-z0-9._-]{1,253}|\[[0-9A-Fa-f:.]{2,45}\]")


@dataclass(frozen=True)
class SentinelURL:
    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    def redacted(self) -> str:
        """The URL with every password as ***."""
        auth = ""
        if self.username is not None or self.password is not None:
            auth = quote(self.username or "", safe="")
            auth += ":***@" if self.password is not None else "@"
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        query = []
        if self.sentinel_username is not None:
            query.append(f"sentinel_username={quote(self.sentinel_username, safe='')}")
        if self.sentinel_password is not None:
            query.append("sentinel_password=***")
        tail = "?" + "&".join(query) if query else ""
        return f"{SCHEME}://{auth}{hosts}/{self.service}/{self.db}{tail}"


def is_sentinel(url: str) -> bool:
    return url.startswith(f"{SCHEME}://")


def parse(url: str) -> SentinelURL:
    """The parts of a `redis+sentinel://` URL; ValueError saying what is wrong otherwise."""
    if len(url) > MAX_LENGTH:
        raise ValueError(f"the URL is longer than {MAX_LENGTH} characters")
    if not is_sentinel(url):
        raise ValueError(f"a Sentinel URL starts with {SCHEME}://")
    rest = url[len(SCHEME) + 3 :]
    rest, _, query = rest.partition("?")
    location, _, path = rest.partition("/")
    auth, at, hosts = location.rpartition("@")
    username = password = None
    if at:
        user, colon, secret = auth.partition(":")
        username = unquote(user) if user else None
        password = unquote(secret) if colon else None
    sentinels = tuple(_address(part) for part in hosts.split(","))
    if len(sentinels) > MAX_SENTINELS:
        raise ValueError(f"at most {MAX_SENTINELS} Sentinels")
    service, _, db_text = path.strip("/").partition("/")
    if not _SERVICE.fullmatch(service):
        raise ValueError(
            "name the primary's service after the hosts: redis+sentinel://HOST:26379/mymaster"
        )
    if db_text and not (db_text.isascii() and db_text.isdigit() and len(db_text) <= 5):
        raise ValueError(f"the database {db_text!r} is not a number")
    options = parse_qs(query, keep_blank_values=True) if query else {}
    unknown = sorted(set(options) - set(QUERY_KEYS))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} (known: {', '.join(QUERY_KEYS)})")
    return SentinelURL(
        sentinels=sentinels,
        service=service,
        db=int(db_text or 0),
        username=username,
        password=password,
        sentinel_username=options.get("sentinel_username", [None])[-1],
        sentinel_password=options.get("sentinel_password", [None])[-1],
    )


def _address(part: str) -> tuple[str, int]:
    host, colon, port_text = part.rpartition(":") if not part.endswith("]") else (part, "", "")
    if not colon:
        host, port_text = part, ""
    if not _HOST.fullmatch(host):
        raise ValueError(f"{part!r} is not HOST:PORT")
    if not port_text:
        return host.strip("[]"), DEFAULT_PORT
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        raise ValueError(f"{part!r} has no port from 1 to 65535")
    return host.strip("[]"), int(port_text)
