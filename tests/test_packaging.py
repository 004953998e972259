"""Installing on a Python that is too old is refused at once, naming the version."""

from __future__ import annotations

import glob
import importlib.util
import shutil
import subprocess
import tomllib

import pytest

from tests.support.processes import ROOT

BACKEND = ROOT / "build_backend" / "switchboard_build.py"


def backend():
    spec = importlib.util.spec_from_file_location("switchboard_build", BACKEND)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_backend_refuses_an_old_python_and_says_which():
    refusal = backend().refusal
    assert refusal((3, 11, 0)) is None and refusal((3, 13, 1)) is None
    message = refusal((3, 10, 13))
    assert message and "needs Python 3.11 or newer" in message and "3.10.13" in message


def test_the_backend_minimum_is_requires_python():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["requires-python"] == ">=" + ".".join(map(str, backend().MINIMUM))
    assert project["build-system"]["build-backend"] == "switchboard_build"


def older_python() -> str | None:
    """A Python 3.8-3.10 that runs here (pyenv's shims may name one that does not)."""
    candidates = [shutil.which(name) for name in ("python3.10", "python3.9", "python3.8")]
    candidates += sorted(glob.glob("/root/.pyenv/versions/3.[89]*/bin/python"))
    candidates += sorted(glob.glob("/root/.pyenv/versions/3.10*/bin/python"))
    for python in filter(None, candidates):
        probe = subprocess.run([python, "-c", "pass"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return python
    return None


def test_an_old_python_is_refused_before_anything_is_resolved():
    python = older_python()
    if python is None:
        pytest.skip("no Python older than 3.11 on this machine")
    done = subprocess.run(
        [python, str(BACKEND)], cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1
    assert "switchboard needs Python 3.11 or newer; this is Python 3." in done.stderr


def test_the_image_copies_the_build_backend():
    """`pip install .` in deploy/Dockerfile runs the backend from `backend-path`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    for folder in project["build-system"]["backend-path"]:
        assert f"COPY {folder} {folder}" in dockerfile
