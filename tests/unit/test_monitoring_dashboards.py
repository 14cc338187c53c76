"""Dashboards: generated JSON is current and complete, and every query is valid PromQL (promtool)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from monitoring import dashboards, promql_check
from monitoring.promql_check import PanelQuery

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "monitoring" / "grafana"
FILES = sorted((GRAFANA / "dashboards").glob("*.json"))
KNOWN_VARIABLES = {"world", "topic", "__rate_interval"}


def _dashboards() -> list[dict]:
    return [json.loads(path.read_text()) for path in FILES]


def _panels() -> list[tuple[str, dict]]:
    return [(d["uid"], p) for d in _dashboards() for p in d["panels"]]


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool is not installed; scripts/services.sh fetch installs it", pytrace=False)
    return path


def test_the_four_dashboards_exist_and_are_current() -> None:
    titles = {d["title"] for d in _dashboards()}
    assert titles == {
        "Causeway / Overview",
        "Causeway / Consistency",
        "Causeway / Worlds",
        "Causeway / Causal & dead letters",
    }
    for uid in dashboards.DASHBOARDS:
        path = GRAFANA / "dashboards" / f"{uid.removeprefix('causeway-')}.json"
        assert path.read_text() == dashboards.render(uid), f"{path.name} is stale: python -m monitoring.dashboards"


def test_dashboard_uids_and_panel_ids_are_unique() -> None:
    uids = [d["uid"] for d in _dashboards()]
    assert len(uids) == len(set(uids))
    for d in _dashboards():
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids)), d["uid"]


def test_world_and_topic_are_query_variables() -> None:
    for d in _dashboards():
        variables = {v["name"]: v for v in d["templating"]["list"]}
        for name in ("world", "topic"):
            v = variables[name]
            assert v["type"] == "query" and v["query"].startswith("label_values("), (d["uid"], name)
            assert v["includeAll"] and v["allValue"] == ".*" and v["multi"]


def test_every_panel_has_unit_description_and_empty_at_rest_declaration() -> None:
    for uid, panel in _panels():
        where = f"{uid} / {panel['title']}"
        assert panel["fieldConfig"]["defaults"]["unit"], f"{where}: no unit"
        assert len(panel["description"]) >= 20, f"{where}: no description"
        assert panel["targets"], f"{where}: no query"
        meta = panel["causeway"]
        assert isinstance(meta["emptyAtRest"], bool), where
        if meta["emptyAtRest"]:
            assert meta["why"] and meta["why"] in panel["description"], f"{where}: say why it may be empty"


def test_panels_use_only_known_variables_and_filter_by_world_or_topic() -> None:
    filtered = 0
    for uid, panel in _panels():
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"]))
            assert used <= KNOWN_VARIABLES, f"{uid} / {panel['title']}: {used - KNOWN_VARIABLES}"
            filtered += bool(used & {"world", "topic"})
    assert filtered > len(_panels()) / 2, "most queries should honour the world/topic variables"


def test_every_expr_is_valid_promql() -> None:
    queries = promql_check.panel_queries()
    assert len(queries) == sum(len(p["targets"]) for _, p in _panels())
    errors = promql_check.check_syntax(queries, promtool=_promtool())
    assert not errors, "\n".join(f"{k}: {v}" for k, v in errors.items())
    # The same with a concrete world and topic, as an operator would pick them.
    variables = {
        "world": promql_check.regex_value("prod"),
        "topic": promql_check.regex_value("onto.changes.objects"),
    }
    assert not promql_check.check_syntax(queries, variables, promtool=_promtool())


def test_syntax_check_reports_the_broken_query() -> None:
    good = PanelQuery("d", 1, "good", "A", 'sum(rate(x{world=~"$world"}[$__rate_interval]))', False, "")
    bad = PanelQuery("d", 2, "bad", "A", "sum by (world (x)", False, "")
    errors = promql_check.check_syntax([good, bad], promtool=_promtool())
    assert set(errors) == {"d/2/A"} and "parse error" in errors["d/2/A"]


def test_substitution() -> None:
    expr = 'rate(m{world=~"$world", topic=~"${topic}"}[$__rate_interval]) [[world]] $unknown'
    assert promql_check.substitute(expr) == 'rate(m{world=~".*", topic=~".*"}[1m]) .* $unknown'
    assert promql_check.substitute("$world", {"world": promql_check.regex_value("a.b")}) == r"a\\.b"


def test_provisioning_points_at_the_mounted_dashboards_and_the_datasource_uid() -> None:
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "causeway.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    source = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    ds = source["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    for uid, panel in _panels():
        assert panel["datasource"]["uid"] == ds["uid"], f"{uid} / {panel['title']}"


def test_nan_only_results_count_as_no_data() -> None:
    nan_vector = {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, "NaN"]}]}
    assert promql_check._count(nan_vector) == (1, False)
    mixed = {"resultType": "vector", "result": [{"value": [1.0, "NaN"]}, {"value": [1.0, "0"]}]}
    assert promql_check._count(mixed) == (2, True)
    assert promql_check._count({"resultType": "scalar", "result": [1.0, "12"]}) == (1, True)
    assert promql_check._count({"resultType": "vector", "result": []}) == (0, False)
