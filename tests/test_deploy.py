"""deploy/ as a new user would apply it: Kubernetes manifests that validate (strictly) and
agree with each other, with the image and with .env.example; compose and the Dockerfile;
the Grafana dashboard and the alert rules over the metrics the code really exports."""

from __future__ import annotations

import fnmatch
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import promql_parser
import pytest
import yaml

from switchboard.settings import Config
from tests.support.runtime import make_runtime
from worker import metrics
from worker.process import DEFAULT_GRACE_SECONDS

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
CORE_FILES = [K8S / "switchboard.yaml", K8S / "redis" / "redis.yaml"]
KEDA_FILE = K8S / "autoscaling.yaml"
KEDA_SCHEMA = json.loads((ROOT / "tests" / "schemas" / "keda.json").read_text())
MEASURED_PEAK_MIB = 145  # worker RSS at rest with 250 slots, the largest measured

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


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def by_kind(kind: str, name: str) -> dict[str, Any]:
    for path in [*CORE_FILES, KEDA_FILE]:
        for doc in documents(path):
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name}")


def container(deployment: str) -> dict[str, Any]:
    [only] = by_kind("Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return only


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def mebibytes(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Mi|Gi)", quantity).groups()  # type: ignore[union-attr]
    return int(number) * (1024 if unit == "Gi" else 1)


# --- Kubernetes --------------------------------------------------------------------------------


def test_core_manifests_pass_kubernetes_validate_strict():
    """`kubernetes-validate` (PyPI) ships the Kubernetes JSON schemas in its wheel: offline."""
    done = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", *map(str, CORE_FILES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    passed = re.findall(r"passed for resource (\S+)", done.stdout + done.stderr)
    assert sorted(passed) == [
        "deployment/switchboard-bot",
        "deployment/switchboard-worker",
        "poddisruptionbudget/switchboard-worker",
        "service/switchboard-redis",
        "statefulset/switchboard-redis",
    ]


def test_keda_objects_pass_their_schema_and_a_broken_one_does_not():
    kinds = {"ScaledObject": 0, "TriggerAuthentication": 0}
    for doc in documents(KEDA_FILE):
        jsonschema.validate(doc, {**KEDA_SCHEMA, **KEDA_SCHEMA["$defs"][doc["kind"]]})
        kinds[doc["kind"]] += 1
        for ref in doc["spec"].get("secretTargetRef", []):
            assert ref["parameter"] in KEDA_SCHEMA["redisAuthParameters"]
    assert kinds == {"ScaledObject": 1, "TriggerAuthentication": 1}

    broken = by_kind("ScaledObject", "switchboard-worker")
    broken["spec"]["triggers"][0]["metadata"]["listLenght"] = "32"  # a typo KEDA would ignore
    schema = {**KEDA_SCHEMA, **KEDA_SCHEMA["$defs"]["ScaledObject"]}
    with pytest.raises(jsonschema.ValidationError, match="listLenght"):
        jsonschema.validate(broken, schema)


def test_kustomizations_name_files_that_exist_and_build_when_kubectl_is_here():
    for folder in (K8S, K8S / "redis"):
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
        assert kustomization["kind"] == "Kustomization"
        for resource in kustomization["resources"]:
            assert (folder / resource).is_file(), resource
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return  # kubernetes-validate above has checked every file the kustomizations name
    import kubernetes_validate

    built = subprocess.run(
        [kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60
    )
    assert built.returncode == 0, built.stderr
    for doc in yaml.safe_load_all(built.stdout):
        if doc["apiVersion"].startswith("keda.sh/"):
            jsonschema.validate(doc, {**KEDA_SCHEMA, **KEDA_SCHEMA["$defs"][doc["kind"]]})
        else:
            kubernetes_validate.validate(doc, "1.37.0", strict=True)


def test_every_pod_reaches_the_one_redis_named_by_the_secret():
    """Without REDIS_URL each pod would start an embedded Redis of its own, and the bot's runs
    would never reach a worker."""
    for name in ("switchboard-bot", "switchboard-worker"):
        spec = container(name)
        assert {"secretRef": {"name": "switchboard"}} in spec["envFrom"]
        assert all(e["name"] != "REDIS_URL" for e in spec.get("env", []))
        assert spec["imagePullPolicy"] == "IfNotPresent"
    assert "REDIS_URL" in (ROOT / ".env.example").read_text()


def test_the_bot_runs_in_the_mode_env_example_is_set_up_for():
    env = (ROOT / ".env.example").read_text()
    set_up = {line.split("=")[0] for line in env.splitlines() if re.match(r"^[A-Z_]+=", line)}
    args = container("switchboard-bot")["args"]
    if "--http" in args:
        assert "SLACK_SIGNING_SECRET" in set_up
    else:
        assert "SLACK_APP_TOKEN" in set_up  # Socket Mode


def test_probes_use_the_port_the_command_opens():
    for name in ("switchboard-bot", "switchboard-worker"):
        spec = container(name)
        ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
        opened = int(flag(spec["args"], "--metrics-port"))
        for probe, path in (
            ("startupProbe", "/livez"),
            ("livenessProbe", "/livez"),
            ("readinessProbe", "/healthz"),
        ):
            get = spec[probe]["httpGet"]
            assert ports[get["port"]] == opened and get["path"] == path, (name, probe)
        annotations = by_kind("Deployment", name)["spec"]["template"]["metadata"]["annotations"]
        assert int(annotations["prometheus.io/port"]) == opened
    assert metrics.LIVE_PATH == "/livez" and metrics.HEALTH_PATH == "/healthz"


def test_workers_get_longer_than_a_step_to_stop_and_memory_above_what_was_measured():
    pod = by_kind("Deployment", "switchboard-worker")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= DEFAULT_GRACE_SECONDS + 60
    for name in ("switchboard-bot", "switchboard-worker"):
        resources = container(name)["resources"]
        assert "cpu" not in resources["limits"]  # throttling delays lease renewals
        assert mebibytes(resources["limits"]["memory"]) >= MEASURED_PEAK_MIB
        assert mebibytes(resources["requests"]["memory"]) >= 72  # one slot's RSS


def test_keda_scales_the_worker_deployment_on_the_rq_queue_in_step_with_concurrency(
    redis_conn, model_server
):
    scaled = by_kind("ScaledObject", "switchboard-worker")
    worker = by_kind("Deployment", "switchboard-worker")
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert "replicas" not in worker["spec"]  # KEDA's HPA owns it
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "redis"
    rt = make_runtime(redis_conn, model_server.url, queue_name=Config().queue)
    assert trigger["metadata"]["listName"] == rt.queue.key == "rq:queue:switchboard"
    concurrency = flag(container("switchboard-worker")["args"], "--concurrency")
    assert trigger["metadata"]["listLength"] == concurrency
    auth = by_kind("TriggerAuthentication", trigger["authenticationRef"]["name"])
    env = (ROOT / ".env.example").read_text()
    for ref in auth["spec"]["secretTargetRef"]:
        assert ref["name"] == "switchboard" and ref["key"] in env  # documented for the Secret
    budget = by_kind("PodDisruptionBudget", "switchboard-worker")
    assert budget["spec"]["selector"] == worker["spec"]["selector"]


def test_the_optional_redis_keeps_an_append_only_file_and_wants_the_password():
    redis_set = by_kind("StatefulSet", "switchboard-redis")
    [spec] = redis_set["spec"]["template"]["spec"]["containers"]
    args = spec["args"]
    assert flag(args, "--appendonly") == "yes" and flag(args, "--appendfsync") == "everysec"
    assert flag(args, "--requirepass") == "$(REDIS_PASSWORD)"
    [password] = spec["env"]
    assert password["valueFrom"]["secretKeyRef"] == {"name": "switchboard", "key": "REDIS_PASSWORD"}
    assert redis_set["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


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


def test_the_image_healthcheck_probes_the_port_the_command_opened(redis_conn, model_server):
    rt = make_runtime(redis_conn, model_server.url)
    server = metrics.serve(0, rt, host="127.0.0.1")
    script = [sys.executable, str(DEPLOY / "healthcheck.py")]
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    commands = {
        ("--metrics-port", str(server.port)): 0,
        ("--http", "--port", str(server.port)): 0,  # /healthz: Redis answers
        ("bot",): 0,  # nothing opened: nothing to probe
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
