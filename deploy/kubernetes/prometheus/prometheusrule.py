"""Write prometheusrule.yaml beside this file from deploy/monitoring/alerts.yaml: the same
alert groups, as the Prometheus Operator's PrometheusRule. alerts.yaml is the one to edit;
run this afterwards (tests/test_deploy.py fails while the two differ):

    python deploy/kubernetes/prometheus/prometheusrule.py           (rewrites the file)
    python deploy/kubernetes/prometheus/prometheusrule.py --check   (exit 1 when out of date)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE.parent.parent / "monitoring" / "alerts.yaml"
OUTPUT = HERE / "prometheusrule.yaml"
HEADER = """\
# Generated from deploy/monitoring/alerts.yaml by prometheusrule.py beside this file: edit
# alerts.yaml, then run `python deploy/kubernetes/prometheus/prometheusrule.py`.
# The Prometheus Operator loads it when its Prometheus selects it: kube-prometheus-stack's
# selects rules labelled `release: <its release name>` unless ruleSelectorNilUsesHelmValues
# is false; add that label here (or in your overlay) to match yours.
"""


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def rule() -> dict[str, Any]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "switchboard",
            "labels": {"app.kubernetes.io/name": "switchboard"},
        },
        "spec": {"groups": groups},
    }


def render() -> str:
    return HEADER + yaml.dump(rule(), Dumper=_Dumper, sort_keys=False, width=96)


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if OUTPUT.read_text(encoding="utf-8") == text:
            return 0
        print(f"{OUTPUT} is out of date: run python {Path(__file__).name}", file=sys.stderr)
        return 1
    OUTPUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
