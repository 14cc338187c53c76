"""Check every dashboard query against Prometheus, without Grafana.

Collects each panel target's ``expr`` from the dashboard JSON, substitutes Grafana's variables
(``$__rate_interval`` → ``1m``, ``$world`` → ``.*`` or a given value, …) and either

* ``check_syntax``: parses them all with ``promtool check rules`` (no server needed), or
* ``check_live``: runs them on a live Prometheus (``/api/v1/query`` answers 400 on bad PromQL) and
  reports, per query, whether it parsed and whether it returned data. A result whose every value is
  NaN (``0/0``, a quantile of an empty histogram) counts as no data: Grafana shows nothing for it.

A panel documents in its ``causeway.emptyAtRest`` field (and description) that it may be empty while
a healthy worker runs; ``QueryResult.acceptable`` is false only for a query that failed to parse, or
that returned nothing without being documented as possibly empty.

    python -m monitoring.promql_check --prometheus http://127.0.0.1:9090 [--world prod] [--topic t]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

DASHBOARD_DIR = Path(__file__).parent / "grafana" / "dashboards"

# Values for Grafana's built-in variables; the scrape interval here is 2-5 s, so 1m holds many points.
BUILTINS: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "30s",
    "__interval_ms": "30000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}
# Regex-typed template variables: "All" becomes .* (the dashboards' allValue).
DEFAULT_VARIABLES: dict[str, str] = {"world": ".*", "topic": ".*"}

_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
_RE2_SPECIAL = re.compile(r"([.+*?()|\[\]{}^$\\])")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str  # dashboard uid
    panel_id: int
    panel: str  # panel title
    ref_id: str
    expr: str  # as written, with Grafana variables
    empty_at_rest: bool
    why_empty: str

    @property
    def key(self) -> str:
        return f"{self.dashboard}/{self.panel_id}/{self.ref_id}"


@dataclass(frozen=True)
class QueryResult:
    query: PanelQuery
    promql: str  # after substitution
    ok: bool  # parsed and evaluated
    error: str = ""
    series: int = 0  # result series (or 1 for a scalar)
    has_data: bool = False  # at least one non-NaN value

    @property
    def acceptable(self) -> bool:
        return self.ok and (self.has_data or self.query.empty_at_rest)


def regex_value(value: str) -> str:
    """A literal value for a ``=~"..."`` matcher inside a PromQL string (backslashes doubled)."""
    return _RE2_SPECIAL.sub(r"\\\\\1", value)


def substitute(expr: str, variables: Mapping[str, str] | None = None) -> str:
    """Replace ``$var``, ``${var}``, ``${var:fmt}`` and ``[[var]]`` with their values.

    ``variables`` override the defaults (``world``/``topic`` = ``.*``) and Grafana's builtins; an
    unknown variable is left as is, so the parse check reports it.
    """
    values = {**BUILTINS, **DEFAULT_VARIABLES, **(variables or {})}

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        return values.get(name, m.group(0))

    return _VAR.sub(one, expr)


def panel_queries(directory: Path = DASHBOARD_DIR) -> list[PanelQuery]:
    """Every panel target with an ``expr`` in every dashboard JSON file of ``directory``."""
    out: list[PanelQuery] = []
    for path in sorted(directory.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in _panels(dashboard.get("panels", [])):
            meta = panel.get("causeway", {})
            for target in panel.get("targets", []):
                if not target.get("expr"):
                    continue
                out.append(
                    PanelQuery(
                        dashboard=dashboard.get("uid", path.stem),
                        panel_id=int(panel.get("id", 0)),
                        panel=panel.get("title", ""),
                        ref_id=target.get("refId", "A"),
                        expr=target["expr"],
                        empty_at_rest=bool(meta.get("emptyAtRest", False)),
                        why_empty=meta.get("why", ""),
                    )
                )
    return out


def _panels(panels: Iterable[dict]) -> Iterable[dict]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))  # panels collapsed inside a row


def check_syntax(
    queries: Iterable[PanelQuery], variables: Mapping[str, str] | None = None, promtool: str = "promtool"
) -> dict[str, str]:
    """Parse every query with ``promtool check rules``; returns {query key: error} (empty when all parse)."""
    queries = list(queries)
    groups = [
        {
            "name": q.key,
            "rules": [{"record": "causeway:dashboard_check", "expr": substitute(q.expr, variables)}],
        }
        for q in queries
    ]
    with tempfile.NamedTemporaryFile("w", suffix=".yml", prefix="dashboard-exprs-") as f:
        yaml.safe_dump({"groups": groups}, f)
        f.flush()
        proc = subprocess.run([promtool, "check", "rules", f.name], capture_output=True, text=True)
    if proc.returncode == 0:
        return {}
    output = proc.stdout + proc.stderr
    errors: dict[str, str] = {}
    for q in queries:
        for line in output.splitlines():
            if f'group "{q.key}"' in line:
                errors[q.key] = line.split("could not parse expression:", 1)[-1].strip()
    if not errors:  # promtool failed for a reason not tied to one query
        errors["promtool"] = output.strip()
    return errors


def check_live(
    prometheus_url: str,
    queries: Iterable[PanelQuery] | None = None,
    variables: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> list[QueryResult]:
    """Run every query on ``prometheus_url`` (instant query, now) and report parse and data per query."""
    queries = panel_queries() if queries is None else list(queries)
    results = []
    with httpx.Client(base_url=prometheus_url.rstrip("/"), timeout=timeout) as client:
        for q in queries:
            promql = substitute(q.expr, variables)
            try:
                resp = client.get("/api/v1/query", params={"query": promql})
                body = resp.json()
            except (httpx.HTTPError, ValueError) as exc:
                results.append(QueryResult(q, promql, ok=False, error=f"request failed: {exc}"))
                continue
            if resp.status_code != 200 or body.get("status") != "success":
                error = f"{body.get('errorType', resp.status_code)}: {body.get('error', resp.text[:200])}"
                results.append(QueryResult(q, promql, ok=False, error=error))
                continue
            series, has_data = _count(body["data"])
            results.append(QueryResult(q, promql, ok=True, series=series, has_data=has_data))
    return results


def _count(data: dict) -> tuple[int, bool]:
    kind, result = data["resultType"], data["result"]
    if kind in ("scalar", "string"):
        return 1, not _nan(result[1])
    if kind == "vector":
        return len(result), any(not _nan(s["value"][1]) for s in result)
    return len(result), any(not _nan(v[1]) for s in result for v in s["values"])  # matrix


def _nan(value: str) -> bool:
    try:
        return math.isnan(float(value))
    except ValueError:
        return False


def report(results: Iterable[QueryResult]) -> str:
    """One line per query: status, data, key, panel title; then the substituted query when it failed."""
    lines = []
    for r in results:
        if not r.ok:
            status = "ERROR"
        elif r.has_data:
            status = "data"
        else:
            status = "empty (documented)" if r.query.empty_at_rest else "EMPTY"
        lines.append(f"{status:<19} {r.series:>3} series  {r.query.key:<28} {r.query.panel}")
        if not r.ok:
            lines.append(f"    {r.error}\n    {r.promql}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prometheus", default="http://127.0.0.1:9090", help="Prometheus base URL")
    parser.add_argument("--world", help="value for $world (default: all, .*)")
    parser.add_argument("--topic", help="value for $topic (default: all, .*)")
    parser.add_argument("--dashboards", type=Path, default=DASHBOARD_DIR, help="folder of dashboard JSON")
    args = parser.parse_args(argv)
    variables = {}
    if args.world:
        variables["world"] = regex_value(args.world)
    if args.topic:
        variables["topic"] = regex_value(args.topic)
    results = check_live(args.prometheus, panel_queries(args.dashboards), variables)
    print(report(results))
    bad = [r for r in results if not r.acceptable]
    print(f"\n{len(results)} queries, {sum(r.has_data for r in results)} with data, {len(bad)} not acceptable")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
