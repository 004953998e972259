"""The image's HEALTHCHECK: GET the port the container's command opened.

`--metrics-port N` -> /livez on N (the process answers); else `--http [--port N]` -> /healthz
on N (default 3000). A command that opened neither (a Socket Mode bot without
`--metrics-port`) has nothing that answers: unhealthy, saying so, since "healthy" would be
said of a process that may be wedged. The image's default command opens 9100. Exit 0
healthy, 1 not.

    python deploy/healthcheck.py [PID]     (default 1: the container's command)
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def target(argv: list[str]) -> str | None:
    def value(flag: str, default: str) -> str:
        return argv[argv.index(flag) + 1] if flag in argv[:-1] else default

    if "--metrics-port" in argv:
        return f"http://127.0.0.1:{value('--metrics-port', '')}/livez"
    if "--http" in argv:
        return f"http://127.0.0.1:{value('--port', '3000')}/healthz"
    return None


def main(pid: str = "1") -> int:
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        argv = [a.decode() for a in cmdline.read().split(b"\0") if a]
    url = target(argv)
    if url is None:
        print(
            "unhealthy: the command opened no port to probe; add --metrics-port 9100",
            file=sys.stderr,
        )
        return 1
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            return 0 if response.status == 200 else 1
    except (OSError, urllib.error.URLError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:2]))
