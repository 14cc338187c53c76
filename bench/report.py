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
