"""Builds causeway's Grafana dashboards as JSON: ``python -m monitoring.dashboards`` rewrites them.

The generated files in ``monitoring/grafana/dashboards/`` are committed (Grafana provisions them from
there); a unit test fails when they differ from what this module builds. Every panel has a unit and
a description, and says whether its query may return nothing while a healthy worker runs under
ordinary load ("empty at rest"): ``monitoring.promql_check`` reads that from the panel's
``causeway`` field when it checks the queries against a live Prometheus.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from monitoring.panels import CAUSAL, CONSISTENCY, OVERVIEW, WORLDS, Panel

DASHBOARD_DIR = Path(__file__).parent / "grafana" / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "causeway-prometheus"}

DASHBOARDS: dict[str, tuple[str, tuple[Panel, ...]]] = {
    "causeway-overview": ("Causeway / Overview", OVERVIEW),
    "causeway-consistency": ("Causeway / Consistency", CONSISTENCY),
    "causeway-worlds": ("Causeway / Worlds", WORLDS),
    "causeway-causal": ("Causeway / Causal & dead letters", CAUSAL),
}


def _variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": query,
        "definition": query,
        "refresh": 2,
        "sort": 1,
        "regex": "",
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "hide": 0,
        "options": [],
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }


def _panel(p: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    description = p.description
    if p.empty_at_rest:
        description += f" Empty at rest: {p.empty_at_rest}."
    steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
    steps += [{"color": c, "value": v} for c, v in p.thresholds]
    defaults: dict[str, Any] = {"unit": p.unit, "thresholds": {"mode": "absolute", "steps": steps}}
    if p.no_value:
        defaults["noValue"] = p.no_value
    if p.kind == "timeseries":
        defaults["custom"] = {"thresholdsStyle": {"mode": "line" if p.thresholds else "off"}}
    return {
        "id": panel_id,
        "type": p.kind,
        "title": p.title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
        if p.kind == "timeseries"
        else {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
        },
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DATASOURCE,
                "expr": q.expr,
                "legendFormat": q.legend,
                "range": True,
                "instant": False,
            }
            for i, q in enumerate(p.queries)
        ],
        "causeway": {"emptyAtRest": bool(p.empty_at_rest), "why": p.empty_at_rest},
        **p.extra,
    }


def build(uid: str) -> dict[str, Any]:
    """The dashboard JSON for ``uid`` (a key of DASHBOARDS)."""
    title, panels = DASHBOARDS[uid]
    out: list[dict[str, Any]] = []
    x = y = 0
    for i, p in enumerate(panels, start=1):
        if x + p.width > 24:
            x, y = 0, y + 8
        out.append(_panel(p, i, x, y))
        x += p.width
    return {
        "uid": uid,
        "title": title,
        "tags": ["causeway"],
        "timezone": "utc",
        "editable": True,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []},
        "links": [{"type": "dashboards", "tags": ["causeway"], "asDropdown": True, "title": "Causeway"}],
        "templating": {
            "list": [
                _variable("world", "World", "label_values(causeway_commits_total, world)"),
                _variable("topic", "Topic", "label_values(causeway_events_consumed_total, topic)"),
            ]
        },
        "panels": out,
    }


def render(uid: str) -> str:
    return json.dumps(build(uid), indent=2, ensure_ascii=False) + "\n"


def write_all(directory: Path = DASHBOARD_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for uid in DASHBOARDS:
        path = directory / f"{uid.removeprefix('causeway-')}.json"
        path.write_text(render(uid))
        paths.append(path)
    return paths


def main() -> int:
    for path in write_all():
        print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
