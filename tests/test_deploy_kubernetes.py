"""deploy/kubernetes as a platform team would adopt it: each overlay (Socket Mode, HTTP mode)
rendered offline and every object validated strictly, the objects agreeing with each other,
with the image, the code and .env.example; the network policy evaluated rule by rule.

The kustomizations compose plain files with `resources:` (and `images:`) only, so `render`
below builds them without a kustomize binary; where one is installed (`kustomize`, or
`kubectl kustomize`), a test checks it builds exactly the same objects."""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import redis
import yaml

from bot.transport.serve import EVENTS_PATH, build_app
from switchboard.settings import Config
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.slack_server import app_mention, event_callback, send_signed
from tests.support.runtime import make_runtime, wait_until
from tests.support.slack_bot import ALICE, SECRET, TOKEN, bot_env, serving
from worker import metrics
from worker.process import DEFAULT_GRACE_SECONDS

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("socket-mode", "http")
SCHEMAS = ROOT / "tests" / "schemas"
KEDA_SCHEMA = json.loads((SCHEMAS / "keda.json").read_text())
PROMETHEUS_SCHEMA = json.loads((SCHEMAS / "prometheus-operator.json").read_text())
KUBERNETES_VERSION = "1.37.0"  # the newest whose schemas kubernetes-validate ships
MEASURED_PEAK_MIB = 145  # worker RSS at rest with 250 slots, the largest measured
SWITCHBOARD_PODS = ("switchboard-bot", "switchboard-worker")


# --- rendering ---------------------------------------------------------------------------------


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def render(folder: Path) -> list[dict[str, Any]]:
    """What `kustomize build folder` makes of a kustomization that only lists resources
    (files, or folders with their own kustomization) and sets images."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    used = set(kustomization) - {"apiVersion", "kind"}
    assert used <= {"resources", "images"}, f"{folder}: {used} is not rendered here"
    assert kustomization["kind"] == "Kustomization"
    objects: list[dict[str, Any]] = []
    for entry in kustomization["resources"]:
        path = folder / entry
        objects += render(path) if path.is_dir() else documents(path)
    for image in kustomization.get("images", []):
        for pod in pod_specs(objects):
            for spec in pod.get("containers", []) + pod.get("initContainers", []):
                spec["image"] = retagged(spec["image"], image)
    keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys)), f"{folder}: an object is listed twice"
    return objects


def retagged(reference: str, image: dict[str, str]) -> str:
    """kustomize's `images:` entry applied to one container image reference."""
    name, _, digest = reference.partition("@")
    tag = ""
    if ":" in name.rsplit("/", 1)[-1]:
        name, tag = name.rsplit(":", 1)
    if name != image["name"]:
        return reference
    new = image.get("newName", name)
    if "digest" in image:
        return f"{new}@{image['digest']}"
    tag = image.get("newTag", tag)
    return new + (f":{tag}" if tag else "") + (f"@{digest}" if digest else "")


@cache
def _rendered(folder: str) -> str:
    return json.dumps(render(K8S / folder))


def rendered(folder: str) -> list[dict[str, Any]]:
    return json.loads(_rendered(folder))  # a fresh copy: a test may change it


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet"):
            yield o["spec"]["template"]["spec"]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for o in objects:
        if o["kind"] == kind and o["metadata"]["name"] == name:
            return o
    raise AssertionError(f"no {kind} {name}")


def container(objects: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    [only] = find(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return only


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def mebibytes(quantity: str) -> float:
    number, unit = quantity[:-2], quantity[-2:]
    return int(number) * {"Mi": 1, "Gi": 1024}[unit]


def kustomize() -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build"]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize"]
    return None


# --- every object, strictly ----------------------------------------------------------------------


def validate(doc: dict[str, Any]) -> None:
    group = doc["apiVersion"].split("/")[0]
    if group == "keda.sh":
        jsonschema.validate(doc, {**KEDA_SCHEMA, **KEDA_SCHEMA["$defs"][doc["kind"]]})
    elif group == "monitoring.coreos.com":
        schema = {**PROMETHEUS_SCHEMA, **PROMETHEUS_SCHEMA["$defs"][doc["kind"]]}
        jsonschema.validate(doc, schema)
    else:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


SHARED = [
    "Deployment/switchboard-bot",
    "Deployment/switchboard-worker",
    "NetworkPolicy/switchboard-bot",
    "NetworkPolicy/switchboard-default-deny",
    "NetworkPolicy/switchboard-worker",
    "PodDisruptionBudget/switchboard-bot",
    "PodDisruptionBudget/switchboard-worker",
    "PodMonitor/switchboard",
    "PrometheusRule/switchboard",
    "ScaledObject/switchboard-worker",
    "ServiceAccount/switchboard",
    "TriggerAuthentication/switchboard-redis",
]
EXPECTED = {
    "socket-mode": SHARED,
    "http": sorted(
        [
            *SHARED,
            "Ingress/switchboard-bot",
            "NetworkPolicy/switchboard-bot-http",
            "Service/switchboard-bot",
        ]
    ),
    "redis": [
        "NetworkPolicy/switchboard-redis",
        "Service/switchboard-redis",
        "ServiceAccount/switchboard-redis",
        "StatefulSet/switchboard-redis",
    ],
}


@pytest.mark.parametrize("folder", [*OVERLAYS, "redis"])
def test_every_rendered_object_passes_its_schema_strictly(folder):
    """Core kinds against Kubernetes' own schemas (kubernetes-validate ships them, offline),
    unknown fields refused; KEDA and Prometheus Operator objects against tests/schemas."""
    objects = rendered(folder)
    for doc in objects:
        validate(doc)
    assert sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects) == EXPECTED[folder]


def test_the_schemas_refuse_a_typo_in_each_kind_we_add():
    http = rendered("http")
    typos: list[tuple[dict[str, Any], str]] = []
    monitor = find(http, "PodMonitor", "switchboard")
    monitor["spec"]["podMetricsEndpoints"][0]["pathh"] = "/metrics"
    typos.append((monitor, "pathh"))
    rule = find(http, "PrometheusRule", "switchboard")
    rule["spec"]["groups"][0]["rules"][0]["labelz"] = {}
    typos.append((rule, "labelz"))
    policy = find(http, "NetworkPolicy", "switchboard-bot")
    policy["spec"]["egress"][0]["too"] = []
    typos.append((policy, "too"))
    ingress = find(http, "Ingress", "switchboard-bot")
    ingress["spec"]["tls"][0]["secret"] = "switchboard-tls"
    typos.append((ingress, "secret"))
    account = find(http, "ServiceAccount", "switchboard")
    account["automountServiceAccountTokens"] = False
    typos.append((account, "automountServiceAccountTokens"))
    for doc, typo in typos:
        with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)) as e:
            validate(doc)
        assert typo in str(e.value), (doc["kind"], str(e.value)[:300])


def test_kustomize_builds_each_overlay_to_exactly_what_its_resources_compose():
    command = kustomize()
    if command is None:
        pytest.skip("no kustomize binary (nor kubectl): rendered by `render` alone")
    for folder in [*OVERLAYS, "redis"]:
        built = subprocess.run(
            [*command, str(K8S / folder)], capture_output=True, text=True, timeout=60
        )
        assert built.returncode == 0, built.stderr
        by_key = lambda objects: {(o["kind"], o["metadata"]["name"]): o for o in objects}  # noqa: E731
        assert by_key(yaml.safe_load_all(built.stdout)) == by_key(rendered(folder)), folder


def test_an_image_set_by_digest_reaches_every_switchboard_container(tmp_path):
    """What `kustomize edit set image switchboard=REGISTRY/switchboard@sha256:...` writes in
    an overlay: the bot's and the workers' containers get it; Redis keeps its own image."""
    digest = "sha256:" + "0" * 64
    for overlay in OVERLAYS:
        mine = tmp_path / overlay
        mine.mkdir()
        (mine / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [str(K8S / overlay)],
                    "images": [
                        {"name": "switchboard", "newName": "reg.example/sb", "digest": digest}
                    ],
                }
            )
        )
        images = {c["image"] for pod in pod_specs(render(mine)) for c in pod["containers"]}
        assert images == {f"reg.example/sb@{digest}"}, overlay
    assert retagged("redis:7", {"name": "switchboard", "newTag": "x"}) == "redis:7"


# --- identity, Redis, configuration -------------------------------------------------------------


@pytest.mark.parametrize("folder", [*OVERLAYS, "redis"])
def test_every_pod_runs_as_a_dedicated_service_account_without_a_token(folder):
    objects = rendered(folder)
    accounts = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ServiceAccount"}
    pods = list(pod_specs(objects))
    assert pods
    for pod in pods:
        name = pod["serviceAccountName"]
        assert name != "default" and name in accounts, name
        assert accounts[name]["automountServiceAccountToken"] is False
        assert pod["automountServiceAccountToken"] is False
    kinds = {o["kind"] for o in objects}
    assert not kinds & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_switchboard_pod_refuses_the_embedded_redis_and_reads_the_secret(overlay):
    """Without REDIS_URL each pod would start an embedded Redis of its own, and the bot's runs
    would never reach a worker: SWITCHBOARD_REQUIRE_REDIS_URL makes that a stop at start."""
    objects = rendered(overlay)
    for name in SWITCHBOARD_PODS:
        spec = container(objects, name)
        env = {e["name"]: e.get("value") for e in spec["env"]}
        assert env["SWITCHBOARD_REQUIRE_REDIS_URL"] == "1", name
        assert "REDIS_URL" not in env  # from the Secret, never written in a manifest
        assert {"secretRef": {"name": "switchboard"}} in spec["envFrom"]
        assert spec["imagePullPolicy"] == "IfNotPresent"
    assert "REDIS_URL" in (ROOT / ".env.example").read_text()


def test_socket_mode_is_what_env_example_sets_up_and_http_mode_needs_the_signing_secret():
    env = (ROOT / ".env.example").read_text()
    set_up = {line.split("=")[0] for line in env.splitlines() if line[:1].isupper()}
    assert {"SLACK_BOT_TOKEN", "SLACK_APP_TOKEN"} <= set_up
    assert "--http" not in container(rendered("socket-mode"), "switchboard-bot")["args"]
    assert "--http" in container(rendered("http"), "switchboard-bot")["args"]
    assert "# SLACK_SIGNING_SECRET=" in env  # documented for the Secret, to fill in


def test_the_two_bots_differ_only_where_the_mode_does():
    socket = find(rendered("socket-mode"), "Deployment", "switchboard-bot")
    http = find(rendered("http"), "Deployment", "switchboard-bot")
    [s], [h] = (
        socket["spec"]["template"]["spec"]["containers"],
        http["spec"]["template"]["spec"]["containers"],
    )
    assert h["args"] == ["bot", "--http", "--port", "3000", *s["args"][1:]]
    assert h["ports"] == [{"name": "http", "containerPort": 3000}, *s["ports"]]
    for c in (s, h):
        del c["args"], c["ports"]
    assert socket == http


# --- probes, resources, scaling --------------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_use_the_port_the_command_opens(overlay):
    objects = rendered(overlay)
    for name in SWITCHBOARD_PODS:
        spec = container(objects, name)
        ports = {p["name"]: p["containerPort"] for p in spec["ports"]}
        opened = int(flag(spec["args"], "--metrics-port"))
        for probe, path in (
            ("startupProbe", metrics.LIVE_PATH),
            ("livenessProbe", metrics.LIVE_PATH),
            ("readinessProbe", metrics.HEALTH_PATH),
        ):
            get = spec[probe]["httpGet"]
            assert ports[get["port"]] == opened and get["path"] == path, (name, probe)
        template = find(objects, "Deployment", name)["spec"]["template"]
        assert int(template["metadata"]["annotations"]["prometheus.io/port"]) == opened
    assert metrics.LIVE_PATH == "/livez" and metrics.HEALTH_PATH == "/healthz"


def test_workers_get_longer_than_a_step_to_stop_and_memory_above_what_was_measured():
    objects = rendered("socket-mode")
    pod = find(objects, "Deployment", "switchboard-worker")["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= DEFAULT_GRACE_SECONDS + 60
    for name in SWITCHBOARD_PODS:
        resources = container(objects, name)["resources"]
        assert "cpu" not in resources["limits"]  # throttling delays lease renewals
        assert mebibytes(resources["limits"]["memory"]) >= MEASURED_PEAK_MIB
        assert mebibytes(resources["requests"]["memory"]) >= 72  # one slot's RSS


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_two_bots_run_and_a_drain_takes_one_at_a_time(overlay):
    objects = rendered(overlay)
    bot = find(objects, "Deployment", "switchboard-bot")
    assert bot["spec"]["replicas"] == 2
    budget = find(objects, "PodDisruptionBudget", "switchboard-bot")
    assert budget["spec"]["maxUnavailable"] == 1
    assert budget["spec"]["selector"] == bot["spec"]["selector"]


def test_two_bot_replicas_on_one_redis_take_a_repeated_event_once(
    redis_conn: redis.Redis, model_server: FakeOpenAI, tmp_path: Path
) -> None:
    """The manifests' answer on replicas, with real parts: two bots (two Bolt apps, each with
    its own runtime, as two pods have) on one Redis; Slack's first delivery of an event goes
    to one, its retry to the other. One run, one job."""
    with bot_env(redis_conn, model_server.url, tmp_path) as first:
        policy = tmp_path / "policy.yaml"  # bot_env wrote it
        second_rt = make_runtime(redis_conn, model_server.url, policy_file=policy)
        second = build_app(
            second_rt, bot_token=TOKEN, signing_secret=SECRET, api_url=first.slack.url
        )
        with serving(second, second_rt) as server:
            body = event_callback(app_mention("<@UBOT> what does SQL Basics cost?", user=ALICE))
            retry = {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}
            assert first.post(body).status == 200
            url = f"http://127.0.0.1:{server.port}{EVENTS_PATH}"
            assert send_signed(url, SECRET, body, headers=retry).status == 200
            first.wait_for_runs(1)
            wait_until(lambda: first.rt.queue.count >= 1, what="the run's job")
            first.settle()
            assert len(first.runs()) == 1
            assert first.rt.queue.count == 1


def test_keda_scales_the_worker_deployment_on_the_rq_queue_in_step_with_concurrency(
    redis_conn, model_server
):
    objects = rendered("socket-mode")
    scaled = find(objects, "ScaledObject", "switchboard-worker")
    worker = find(objects, "Deployment", "switchboard-worker")
    assert scaled["spec"]["scaleTargetRef"]["name"] == worker["metadata"]["name"]
    assert "replicas" not in worker["spec"]  # KEDA's HPA owns it
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "redis"
    rt = make_runtime(redis_conn, model_server.url, queue_name=Config().queue)
    assert trigger["metadata"]["listName"] == rt.queue.key == "rq:queue:switchboard"
    concurrency = flag(container(objects, "switchboard-worker")["args"], "--concurrency")
    assert trigger["metadata"]["listLength"] == concurrency
    auth = find(objects, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    env = (ROOT / ".env.example").read_text()
    for ref in auth["spec"]["secretTargetRef"]:
        assert ref["name"] == "switchboard" and ref["key"] in env  # documented for the Secret
        assert ref["parameter"] in KEDA_SCHEMA["redisAuthParameters"]
    budget = find(objects, "PodDisruptionBudget", "switchboard-worker")
    assert budget["spec"]["selector"] == worker["spec"]["selector"]

    scaled["spec"]["triggers"][0]["metadata"]["listLenght"] = "32"  # a typo KEDA would ignore
    with pytest.raises(jsonschema.ValidationError, match="listLenght"):
        validate(scaled)


def test_the_optional_redis_keeps_an_append_only_file_and_wants_the_password():
    redis_set = find(rendered("redis"), "StatefulSet", "switchboard-redis")
    [spec] = redis_set["spec"]["template"]["spec"]["containers"]
    args = spec["args"]
    assert flag(args, "--appendonly") == "yes" and flag(args, "--appendfsync") == "everysec"
    assert flag(args, "--requirepass") == "$(REDIS_PASSWORD)"
    [password] = spec["env"]
    assert password["valueFrom"]["secretKeyRef"] == {"name": "switchboard", "key": "REDIS_PASSWORD"}
    assert redis_set["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"


# --- HTTP mode: Service, Ingress, TLS ------------------------------------------------------------


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and matchExpressions) against labels."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        present, values = key in labels, expression.get("values", [])
        if not {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]:
            return False
    return True


def pod_labels(objects: list[dict[str, Any]], name: str) -> dict[str, str]:
    return find(objects, "Deployment", name)["spec"]["template"]["metadata"]["labels"]


def test_http_mode_routes_only_slack_events_over_tls_to_the_bots_http_port():
    objects = rendered("http")
    bot = container(objects, "switchboard-bot")
    ports = {p["name"]: p["containerPort"] for p in bot["ports"]}
    assert ports["http"] == int(flag(bot["args"], "--port"))

    service = find(objects, "Service", "switchboard-bot")
    assert matches(
        {"matchLabels": service["spec"]["selector"]}, pod_labels(objects, "switchboard-bot")
    )
    assert not matches(
        {"matchLabels": service["spec"]["selector"]}, pod_labels(objects, "switchboard-worker")
    )
    [port] = service["spec"]["ports"]  # the metrics port stays off the Service
    assert port["targetPort"] == "http" and port["name"] == "http"

    ingress = find(objects, "Ingress", "switchboard-bot")
    [rule] = ingress["spec"]["rules"]
    [tls] = ingress["spec"]["tls"]
    assert rule["host"] in tls["hosts"] and tls["secretName"]
    [path] = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == (EVENTS_PATH, "Exact")
    backend = path["backend"]["service"]
    assert backend == {"name": service["metadata"]["name"], "port": {"name": port["name"]}}
    assert "Ingress" not in {o["kind"] for o in rendered("socket-mode")}


# --- Prometheus Operator -------------------------------------------------------------------------


def test_the_prometheus_rule_carries_exactly_the_groups_of_alerts_yaml():
    alerts = yaml.safe_load((ROOT / "deploy" / "monitoring" / "alerts.yaml").read_text())
    rule = find(rendered("socket-mode"), "PrometheusRule", "switchboard")
    regenerate = "python deploy/kubernetes/prometheus/prometheusrule.py"
    assert rule["spec"]["groups"] == alerts["groups"], f"alerts.yaml changed: run {regenerate}"
    checked = subprocess.run(
        [sys.executable, str(K8S / "prometheus" / "prometheusrule.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pod_monitor_scrapes_the_metrics_port_of_the_bot_and_every_worker(overlay):
    objects = rendered(overlay)
    monitor = find(objects, "PodMonitor", "switchboard")
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == metrics.METRICS_PATH
    for name in SWITCHBOARD_PODS:
        assert matches(monitor["spec"]["selector"], pod_labels(objects, name)), name
        ports = {p["name"]: p["containerPort"] for p in container(objects, name)["ports"]}
        assert ports[endpoint["port"]] == int(
            flag(container(objects, name)["args"], "--metrics-port")
        )
    redis_pod = find(rendered("redis"), "StatefulSet", "switchboard-redis")
    assert not matches(
        monitor["spec"]["selector"], redis_pod["spec"]["template"]["metadata"]["labels"]
    )


# --- the network policy ------------------------------------------------------------------------

NAMESPACE = {"kubernetes.io/metadata.name": "switchboard"}
DNS = {
    "namespace": {"kubernetes.io/metadata.name": "kube-system"},
    "labels": {"k8s-app": "kube-dns"},
}
REDIS = {
    "namespace": NAMESPACE,
    "labels": {"app.kubernetes.io/name": "switchboard", "app.kubernetes.io/component": "redis"},
}
MODEL = {
    "namespace": {"kubernetes.io/metadata.name": "llm"},
    "labels": {"app.kubernetes.io/name": "model-server"},
}
OTHER = {"namespace": NAMESPACE, "labels": {"app": "something-else"}}
PROMETHEUS = {
    "namespace": {"kubernetes.io/metadata.name": "monitoring"},
    "labels": {"app": "prometheus"},
}
INGRESS_NGINX = {
    "namespace": {"kubernetes.io/metadata.name": "ingress-nginx"},
    "labels": {"app": "nginx"},
}
SLACK = "52.89.1.10"  # a public address
METADATA = "169.254.169.254"  # the cloud's instance metadata service


def peer_matches(peer: dict[str, Any], other: dict[str, Any] | str) -> bool:
    """A NetworkPolicy peer (`from:`/`to:` item) against a pod or an IP address."""
    if isinstance(other, str):
        if "ipBlock" not in peer:
            return False  # pod selectors select pods, not outside addresses
        block = peer["ipBlock"]
        address = ipaddress.ip_address(other)
        network = ipaddress.ip_network(block["cidr"])
        if address.version != network.version or address not in network:
            return False
        return not any(address in ipaddress.ip_network(e) for e in block.get("except", []))
    if "ipBlock" in peer:
        return False  # treated as outside the cluster, as for pod traffic it usually is
    namespace_ok = (
        matches(peer["namespaceSelector"], other["namespace"])
        if "namespaceSelector" in peer
        else other["namespace"] == NAMESPACE
    )
    return namespace_ok and matches(peer.get("podSelector", {}), other["labels"])


def port_matches(
    ports: list[dict[str, Any]], port: int, protocol: str, named: dict[str, int]
) -> bool:
    if not ports:
        return True
    for entry in ports:
        number = named.get(entry["port"]) if isinstance(entry["port"], str) else entry["port"]
        if number == port and entry.get("protocol", "TCP") == protocol:
            return True
    return False


def allowed(
    policies: list[dict[str, Any]],
    direction: str,
    pod: dict[str, Any],
    other: dict[str, Any] | str,
    port: int,
    protocol: str = "TCP",
) -> bool:
    """Kubernetes' NetworkPolicy semantics for one connection seen from `pod`: isolated in
    that direction when any policy selecting it lists the direction; then allowed when any
    rule of those policies matches both the peer and the port (named ports are the pod's)."""
    policy_type, key, peers = {
        "egress": ("Egress", "egress", "to"),
        "ingress": ("Ingress", "ingress", "from"),
    }[direction]
    selecting = [
        p
        for p in policies
        if policy_type in p["spec"]["policyTypes"]
        and matches(p["spec"]["podSelector"], pod["labels"])
    ]
    if not selecting:
        return True
    named = pod["ports"] if direction == "ingress" else {}
    for policy in selecting:
        for rule in policy["spec"].get(key, []):
            peer_ok = not rule.get(peers) or any(peer_matches(p, other) for p in rule[peers])
            if peer_ok and port_matches(rule.get("ports", []), port, protocol, named):
                return True
    return False


def pod_of(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    template = find(objects, kind, name)["spec"]["template"]
    ports = {
        p["name"]: p["containerPort"] for c in template["spec"]["containers"] for p in c["ports"]
    }
    return {"namespace": NAMESPACE, "labels": template["metadata"]["labels"], "ports": ports}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_network_policy_lets_each_pod_reach_what_it_needs_and_nothing_more(overlay):
    objects = [*rendered(overlay), *rendered("redis")]
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    bot = pod_of(objects, "Deployment", "switchboard-bot")
    worker = pod_of(objects, "Deployment", "switchboard-worker")
    redis_pod = {**pod_of(objects, "StatefulSet", "switchboard-redis")}

    def out(
        pod: dict[str, Any], other: dict[str, Any] | str, port: int, protocol: str = "TCP"
    ) -> bool:
        return allowed(policies, "egress", pod, other, port, protocol)

    def into(pod: dict[str, Any], other: dict[str, Any] | str, port: int) -> bool:
        return allowed(policies, "ingress", pod, other, port)

    for pod in (bot, worker):  # DNS, Redis, Slack (and for workers OpenAI) over HTTPS
        assert out(pod, DNS, 53, "UDP") and out(pod, DNS, 53, "TCP")
        assert out(pod, REDIS, 6379) and out(pod, SLACK, 443) and out(pod, "2600:1f14::1", 443)
        assert not out(pod, SLACK, 80)  # HTTPS only
        assert not out(pod, METADATA, 80) and not out(pod, METADATA, 443)
        assert not out(pod, "10.0.3.4", 443) and not out(pod, "192.168.1.1", 443)
        assert not out(pod, OTHER, 8080) and not out(pod, {**DNS, "labels": {}}, 53, "UDP")
        assert into(pod, PROMETHEUS, 9100)  # scraped by the monitoring namespace only
        assert not into(pod, OTHER, 9100) and not into(pod, INGRESS_NGINX, 9100)
    assert out(worker, MODEL, 8000) and not out(bot, MODEL, 8000)

    http_mode = overlay == "http"
    assert into(bot, INGRESS_NGINX, 3000) is http_mode  # Slack's requests, through the Ingress
    assert not into(bot, OTHER, 3000) and not into(worker, INGRESS_NGINX, 3000)

    for client in (bot, worker):
        assert into(redis_pod, client, 6379)
    for stranger in (
        OTHER,
        PROMETHEUS,
        {**OTHER, "labels": {**bot["labels"], "app.kubernetes.io/component": "x"}},
    ):
        assert not into(redis_pod, stranger, 6379)
    assert not out(redis_pod, SLACK, 443) and not out(redis_pod, DNS, 53, "UDP")
