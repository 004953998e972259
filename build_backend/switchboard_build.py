"""The build backend: setuptools, after refusing a Python older than Switchboard supports.

pip checks `requires-python` only after it has resolved every dependency, so on an older
Python it spends minutes backtracking through their versions before it says no. pip asks
this backend what it needs before resolving anything, so the refusal comes at once.
Keep MINIMUM equal to `requires-python` in pyproject.toml (a test checks).
"""

from __future__ import annotations

import sys

MINIMUM = (3, 11)


def refusal(version: tuple[int, ...] = tuple(sys.version_info[:3])) -> str | None:
    """Why this Python cannot build Switchboard, or None if it can."""
    if tuple(version[:2]) >= MINIMUM:
        return None
    need = ".".join(map(str, MINIMUM))
    have = ".".join(map(str, version))
    return (
        f"switchboard needs Python {need} or newer; this is Python {have} "
        f"({sys.executable}). Make the virtualenv with a newer one, for example: "
        f"python{need} -m venv .venv"
    )


_problem = refusal()
if _problem:
    raise SystemExit(_problem)

from setuptools.build_meta import *  # noqa: E402, F403
