"""The alerting rules and the dashboard in docs/monitoring/: promtool's own unit tests of
the rules, and every metric the rules and the dashboard name is one the sidecar exports."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from monitor.metrics import Metrics
from tests.helpers import REPO

DIR = REPO / "docs" / "monitoring"
NAMES = re.compile(r"\bsessionwatch_[a-z_]+")


def exported() -> set[str]:
    names = set()
    for family in Metrics().registry.collect():
        names.add(family.name)
        if family.type == "counter":  # a labelled one has no sample before its first use
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_sum", "_count"))
        names.update(sample.name for sample in family.samples)
    return names


def test_the_rules_pass_their_promtool_unit_tests() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("SESSIONWATCH_REQUIRE_PROMTOOL"):
            pytest.fail("promtool is required here (Debian's prometheus package)")
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    for argv in (["check", "rules", "sessionwatch-alerts.yml"],
                 ["test", "rules", "sessionwatch-alerts.test.yml"]):  # fmt: skip
        done = subprocess.run([promtool, *argv], cwd=DIR, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_rules_and_the_dashboard_name_only_exported_metrics() -> None:
    known = exported()
    rules = (DIR / "sessionwatch-alerts.yml").read_text()
    dashboard = json.loads((DIR / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    named = set(NAMES.findall(rules)) | {n for e in exprs for n in NAMES.findall(e)}
    assert named and named <= known, sorted(named - known)
    assert {"title", "uid", "panels", "schemaVersion"} <= set(dashboard)
    for panel in dashboard["panels"]:
        assert panel["title"] and panel["type"] in ("timeseries", "stat") and panel["gridPos"]
        assert panel["targets"], panel["title"]
