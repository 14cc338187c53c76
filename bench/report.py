"""The markdown table of a run (printed, saved next to the JSON, pasted into docs/benchmarks.md)."""

from __future__ import annotations

from typing import Any

ROWS: tuple[tuple[str, str], ...] = (
    ("events/s (sustained, until all committed)", "events_per_s"),
    ("events settled / preloaded", "_settled"),
    ("start-up until the group is Stable (s)", "startup_s"),
    ("e2e latency p50 / p95 / p99 (s)", "_latency"),
    ("  at offered rate (events/s), not visible", "_offered"),
    ("e2e latency p50 / p99 (s) at further rates", "_more_latency"),
    ("Nessie commits (per 1k events)", "_commits"),
    ("commit duration mean / p50 / p99 (s)", "_commit_s"),
    ("peak RSS, all processes (MiB)", "peak_rss_mb"),
    ("CPU s per 1k events (contender)", "cpu_s_per_1k_events"),
    ("CPU s per 1k events (Kafka + Nessie + Redis)", "_svc_cpu"),
    ("Parquet bytes written per byte ingested", "write_amplification"),
    ("bytes superseded per byte ingested (rewrites)", "rewrite_amplification"),
    ("metadata bytes written per 1k events", "metadata_bytes_per_1k_events"),
    ("current metadata JSON, all tables (KiB)", "_meta_now"),
)


def _cell(fig: dict[str, Any], key: str) -> str:
    if key == "_settled":
        s = f"{fig['events_settled']} / {fig['events_preloaded']}"
        if fig.get("stalled"):
            return s + " (**stalled**)"
        return s + (" (time-capped)" if fig["capped"] else "")
    if key == "_latency":
        lat = fig["latency_s"]
        return " / ".join(f"{lat.get(q, float('nan')):.2f}" for q in ("p50", "p95", "p99")) if lat else "-"
    if key == "_offered":
        return f"{fig['latency_offered_rate']}, {fig['latency_censored']} of {fig['latency_records']}"
    if key == "_more_latency":
        more = fig.get("latency_phases", [])[1:]
        cells = [
            f"{ph['latency_s'].get('p50', float('nan')):.2f} / {ph['latency_s'].get('p99', float('nan')):.2f}"
            f" at {ph['offered_rate']:,}/s ({ph['censored']} of {ph['records']} not visible)"
            for ph in more
            if ph["latency_s"]
        ]
        return "; ".join(cells) or "-"
    if key == "_commits":
        return f"{fig['nessie_commits']} ({fig['commits_per_1k_events']})"
    if key == "_commit_s":
        c = fig["commit_s"]
        return " / ".join(f"{c.get(q, float('nan')):.3f}" for q in ("mean", "p50", "p99")) if c else "-"
    if key == "_svc_cpu":
        svc = fig["services_cpu_s_per_1k_events"]
        return f"{sum(svc.values()):.3f}" if svc else "-"
    if key == "_meta_now":
        return f"{fig['current_metadata_json_bytes'] / 1024:.1f}"
    value = fig.get(key)
    if value is None:
        return "-"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown(doc: dict[str, Any]) -> str:
    run = doc["run"]
    names = [n for n in ("causeway", "ceiling", "naive") if n in doc["contenders"]]
    prof = run["profile"]
    head = (
        f"Run `{run['id']}` ({run['started']}), profile **{prof['name']}**: {run['workload']['records']:,} records "
        f"({run['workload']['bad']} bad, {prof['duplicate_rate']:.0%} duplicates, "
        f"{prof['causal_share']:.0%} with `caused_by`, {prof['late_cause_share']:.0%} of those published before "
        f"their cause), {prof['worlds']} worlds, {prof['keys']:,} keys/world, {prof['partitions']} partitions, "
        f"{prof['workers']} causeway worker(s), naive commits every {prof['naive_batch']} event(s). "
        f"Machine: {run['machine']['cpus']} CPUs ({run['machine']['cpu']}), load {run['machine']['load_avg']}.\n"
    )
    lines = [head, "| figure | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for label, key in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(doc["contenders"][n], key) for n in names) + " |")
    lines.append("")
    for pair, r in doc.get("ratios", {}).items():
        parts = ", ".join(f"{k} {v}" for k, v in r.items())
        lines.append(f"- **{pair}**: {parts}")
    return "\n".join(lines) + "\n"


# --- the scaling curve: one row per point of an axis -----------------------------------------------

SCALE_HEAD = (
    "| point | run | load 1m (start → end) | causeway events/s | ceiling events/s | **ratio** "
    "| worker CPU s / 1k events (causeway / ceiling) | services CPU s / 1k (causeway run) "
    "| worker CPU s, whole preload | peak RSS MiB (largest worker / all) | p99 e2e (s) at offered rate "
    "(causeway / ceiling) | commit mean (s), commits / 1k | drained |"
)


def _num(value: Any, fmt: str = "{:,.0f}") -> str:
    return "-" if value is None else fmt.format(value)


def scale_row(point: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """The scaling figures of one point (a run's JSON): causeway against the ceiling of the same run."""
    cs = doc["contenders"]
    cw, cl = cs.get("causeway", {}), cs.get("ceiling", {})
    loads = [c["load_avg_1m"] for c in cs.values() if c.get("load_avg_1m")]
    machine = doc["run"].get("machine", {})
    load = (
        [loads[0][0], loads[-1][1]]
        if loads
        else [machine.get("load_avg_start", [None])[0], machine.get("load_avg", [None])[0]]
    )
    settled = cw.get("events_settled") or 0

    def p99(fig: dict[str, Any]) -> float | None:
        return fig.get("latency_s", {}).get("p99") if fig else None

    return {
        "point": point,
        "run": doc["run"]["id"],
        "load_1m": load,
        "causeway_events_per_s": cw.get("events_per_s"),
        "ceiling_events_per_s": cl.get("events_per_s"),
        "ratio": doc.get("ratios", {}).get("causeway/ceiling", {}).get("events_per_s"),
        "causeway_cpu_s_per_1k": cw.get("cpu_s_per_1k_events"),
        "ceiling_cpu_s_per_1k": cl.get("cpu_s_per_1k_events"),
        "services_cpu_s_per_1k": cw.get("services_cpu_s_per_1k_events", {}),
        "causeway_cpu_s": round(cw["cpu_s_per_1k_events"] * settled / 1000, 1) if cw else None,
        "worker_peak_rss_mb": cw.get("peak_rss_per_process_mb"),
        "all_workers_peak_rss_mb": cw.get("peak_rss_mb"),
        "offered_rate": cw.get("latency_offered_rate"),
        "causeway_p99_s": p99(cw),
        "ceiling_p99_s": p99(cl),
        "commit_mean_s": cw.get("commit_s", {}).get("mean") if cw else None,
        "commits_per_1k": cw.get("commits_per_1k_events"),
        "drained": bool(cw) and not cw.get("capped") and not cw.get("stalled"),
        "settled_before_ready": cw.get("events_settled_before_ready", 0),
        "settled": settled,
    }


def scale_markdown(axis: str, rows: list[dict[str, Any]]) -> str:
    """The axis's table, one row per point (what docs/benchmarks.md's scaling section shows)."""
    lines = [f"Axis **{axis}**", "", SCALE_HEAD, "|" + " --- |" * (SCALE_HEAD.count(" | ") + 1)]
    columns = SCALE_HEAD.count(" | ") + 1
    for r in rows:
        point = ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in r["point"].items())
        if "failed" in r:
            lines.append(f"| {point} | **failed**: {r['failed']} |" + " |" * (columns - 2))
            continue
        svc = r["services_cpu_s_per_1k"]
        cells = [
            point,
            f"`{r['run']}`",
            " → ".join(_num(x, "{:.2f}") for x in r["load_1m"]),
            _num(r["causeway_events_per_s"]),
            _num(r["ceiling_events_per_s"]),
            _num(r["ratio"], "**{:.2f}**"),
            f"{_num(r['causeway_cpu_s_per_1k'], '{:.3f}')} / {_num(r['ceiling_cpu_s_per_1k'], '{:.3f}')}",
            ", ".join(f"{k} {v:.3f}" for k, v in sorted(svc.items())) or "-",
            _num(r["causeway_cpu_s"], "{:.1f}"),
            f"{_num(r['worker_peak_rss_mb'])} / {_num(r['all_workers_peak_rss_mb'])}",
            f"{_num(r['causeway_p99_s'], '{:.2f}')} / {_num(r['ceiling_p99_s'], '{:.2f}')}"
            f" at {_num(r['offered_rate'])}/s",
            f"{_num(r['commit_mean_s'], '{:.2f}')}, {_num(r['commits_per_1k'], '{}')}",
            ("yes" if r["drained"] else "**no**")
            + (
                f" ({r['settled_before_ready']:,} settled before every worker was in: not timed)"
                if r.get("settled_before_ready")
                else ""
            ),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
