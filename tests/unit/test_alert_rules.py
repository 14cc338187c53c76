"""Alert and recording rules: promtool checks them and runs their unit tests; every alert is tested
firing and not firing."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.tools import require_promtool

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "monitoring" / "prometheus"
RULE_FILES = sorted((PROM / "rules").glob("*.yml"))
TEST_FILES = sorted((PROM / "tests").glob("*.yml"))


def _promtool(*args: str) -> None:
    """Run promtool (missing: skipped outside CI, a failure in CI; see ``tests.tools``)."""
    proc = subprocess.run([require_promtool(), *args], capture_output=True, text=True, cwd=PROM)
    if proc.returncode != 0:
        pytest.fail(f"promtool {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}", pytrace=False)


def _alerts() -> list[str]:
    names = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            names += [rule["alert"] for rule in group["rules"] if "alert" in rule]
    return names


def test_rule_and_test_files_exist() -> None:
    assert RULE_FILES, "no rule files under monitoring/prometheus/rules"
    assert TEST_FILES, "no promtool unit tests under monitoring/prometheus/tests"


def test_promtool_check_rules() -> None:
    _promtool("check", "rules", *map(str, RULE_FILES))


def test_promtool_test_rules() -> None:
    _promtool("test", "rules", *map(str, TEST_FILES))


def test_docker_compose_prometheus_config_is_valid() -> None:
    _promtool("check", "config", "--syntax-only", str(PROM / "prometheus.yml"))


def test_compose_config_scrapes_the_worker_and_loads_the_mounted_rules() -> None:
    config = yaml.safe_load((PROM / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    # The worker alerts select job="causeway" and the lag-exporter ones job="causeway-lag"; workers are
    # discovered (DNS of the compose service: one address per replica), never a fixed list.
    assert "static_configs" not in jobs["causeway"]
    assert jobs["causeway"]["dns_sd_configs"] == [
        {"names": ["worker"], "type": "A", "port": 6066, "refresh_interval": "15s"}
    ]
    assert [t for sc in jobs["causeway-lag"]["static_configs"] for t in sc["targets"]] == ["lag-exporter:6065"]


def test_native_config_discovers_workers_from_files_with_the_same_jobs(tmp_path: Path) -> None:
    env = {**os.environ, "CAUSEWAY_PROMETHEUS_SD_DIR": str(tmp_path), "CAUSEWAY_PROMETHEUS_PORT": "9999"}
    text = subprocess.run(
        [str(ROOT / "scripts" / "services.sh"), "prometheus-config"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    config = yaml.safe_load(text)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["causeway"] == {"job_name": "causeway", "file_sd_configs": [{"files": [f"{tmp_path}/worker-*.json"]}]}
    assert jobs["causeway-lag"]["file_sd_configs"] == [{"files": [f"{tmp_path}/lag-exporter-*.json"]}]
    assert config["rule_files"] == [f"{ROOT}/monitoring/prometheus/rules/*.yml"]
    conf = tmp_path / "prometheus.yml"
    conf.write_text(text)
    _promtool("check", "config", str(conf))


@pytest.mark.parametrize("alert", _alerts())
def test_every_alert_is_tested_firing_and_not_firing(alert: str) -> None:
    firing = silent = False
    for path in TEST_FILES:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                if check["alertname"] != alert:
                    continue
                if check.get("exp_alerts"):
                    firing = True
                else:
                    silent = True
    assert firing, f"no promtool test shows {alert} firing"
    assert silent, f"no promtool test shows {alert} not firing"


def test_every_alert_has_severity_summary_and_description() -> None:
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" not in rule:
                    continue
                assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
                assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_alerts_read_recording_rules_of_their_own_group_only() -> None:
    """Groups are evaluated independently: an alert reading another group's recording rule may see
    it one interval late (a flaky threshold in tests, a late alert in production)."""
    for path in RULE_FILES:
        groups = yaml.safe_load(path.read_text())["groups"]
        recorded_in = {r["record"]: g["name"] for g in groups for r in g["rules"] if "record" in r}
        for group in groups:
            for rule in group["rules"]:
                for name in re.findall(r"causeway:[a-z0-9_:]+", rule["expr"]):
                    assert recorded_in.get(name) == group["name"], f"{rule.get('alert')} reads {name}"
