"""``python -m bench``: the benchmark harness (see docs/benchmarks.md).

    python -m bench run                       # the small profile: causeway, ceiling, naive; a few minutes
    python -m bench run --profile full        # 1M events, 10 worlds, 2 workers (long; not for CI)
    python -m bench run --events 100000 --worlds 100 --contenders causeway,ceiling
    python -m bench scale --axis workers      # the scaling curve along one axis (one run per point)
    python -m bench scale --axis keys         # 1M and 5M keys in one world (bench.keys_seeded)
    python -m bench scale --axis events --points 50000,500000 --latency-seconds 5   # other points
    python -m bench soak --minutes 30         # causeway under steady load: commit latency and RSS flat?
    python -m bench dedupe-memory --marks 10000000   # Redis bytes per applied-event mark

Results go to bench/results/<time>-<profile>-<id>.json and .md; the table is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench import dedupe_memory
from bench.cleanup import clean
from bench.harness import RESULTS, Run, command_line, save
from bench.profiles import CONTENDERS, PROFILES, SCALE_AXES
from bench.report import markdown, scale_markdown, scale_row


def _add_overrides(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--profile", default="small", choices=sorted(PROFILES), help="base profile (default: small)")
    ap.add_argument("--events", type=int, help="preloaded records")
    ap.add_argument("--worlds", type=int)
    ap.add_argument("--keys", type=int, help="objects per world")
    ap.add_argument("--workers", type=int, help="causeway worker processes")
    ap.add_argument("--partitions", type=int)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--duplicate-rate", type=float)
    ap.add_argument("--bad-rate", type=float)
    ap.add_argument("--causal-share", type=float)
    ap.add_argument("--naive-batch", type=int, help="events per naive commit (1 = a commit per event)")
    ap.add_argument("--naive-cap", type=float, dest="naive_cap_s", help="seconds the naive contender may drain")
    ap.add_argument("--latency-rate", type=int, help="events/s offered in the latency phase")
    ap.add_argument("--latency-seconds", type=float)
    ap.add_argument(
        "--extra-latency-rates",
        help="comma-separated events/s of further latency phases after the first (0 for none; small: 5000)",
    )
    ap.add_argument("--contenders", help=f"comma-separated subset of {','.join(CONTENDERS)}")
    ap.add_argument(
        "--debezium", action="store_true", default=None, help="Debezium envelopes + the CDC ingest (causeway only)"
    )
    ap.add_argument("--py-spy", action="store_true", help="profile causeway's workers with py-spy (raw stacks)")
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep the run's Nessie branches, Kafka topics and warehouse files (removed at the end by default)",
    )
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder (default bench/results)")


def _profile(args: argparse.Namespace, **extra: object):
    changes = {
        k: getattr(args, k)
        for k in (
            "events",
            "worlds",
            "keys",
            "workers",
            "partitions",
            "seed",
            "duplicate_rate",
            "bad_rate",
            "causal_share",
            "naive_batch",
            "naive_cap_s",
            "latency_rate",
            "latency_seconds",
            "debezium",
        )
    }
    if args.extra_latency_rates is not None:
        try:
            rates = tuple(int(r) for r in args.extra_latency_rates.split(",") if r.strip())
        except ValueError:
            raise SystemExit(f"--extra-latency-rates: not a list of integers: {args.extra_latency_rates!r}") from None
        changes["extra_latency_rates"] = tuple(r for r in rates if r > 0)
    if args.contenders:
        names = tuple(n.strip() for n in args.contenders.split(",") if n.strip())
        unknown = set(names) - set(CONTENDERS)
        if unknown:
            raise SystemExit(f"unknown contenders: {', '.join(sorted(unknown))}")
        changes["contenders"] = names
    changes.update(extra)
    return PROFILES[args.profile].with_(**changes)


def _run(profile, args: argparse.Namespace) -> dict:
    run = Run(profile, out_dir=args.out, py_spy=args.py_spy, log=lambda m: print(m, flush=True))
    doc = asyncio.run(run.run())
    json_path, md_path = save(doc, args.out)
    if args.py_spy:
        from bench.profiling import summarize_dir

        doc["profile_top"] = summarize_dir(run.work)
        json_path.write_text(json.dumps(doc, indent=2, default=str))
        print(json.dumps(doc["profile_top"], indent=2))
    print()
    print(markdown(doc))
    print(f"results: {json_path}\n         {md_path}")
    if not getattr(args, "keep", False):
        print(f"removed what the run made (--keep keeps it): {asyncio.run(clean(run))}")
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    raw = argparse.RawDescriptionHelpFormatter
    _add_overrides(
        sub.add_parser(
            "run",
            help="one run: every contender on the same input",
            formatter_class=raw,
            epilog="examples:\n  python -m bench run\n  python -m bench run --contenders causeway,ceiling"
            "\n  python -m bench run --worlds 100 --keys 1000 --events 100000 --latency-seconds 5",
        )
    )
    scale = sub.add_parser(
        "scale",
        help="the scaling curve: one run per point of an axis",
        formatter_class=raw,
        epilog="examples:\n  python -m bench scale --axis worlds\n"
        "  python -m bench scale --axis events --points 50000,500000 --latency-seconds 5",
    )
    _add_overrides(scale)
    scale.add_argument("--axis", required=True, choices=sorted(SCALE_AXES))
    scale.add_argument(
        "--points", help="comma-separated values of the axis's knob instead of its default points (e.g. 50000,500000)"
    )
    soak = sub.add_parser(
        "soak",
        help="causeway under steady load; reports whether commit latency and RSS stay flat",
        formatter_class=raw,
        epilog="example:\n  python -m bench soak --minutes 30 --rate 5000",
    )
    soak.add_argument("--minutes", type=float, default=30.0)
    soak.add_argument("--rate", type=int, default=2_000, help="events/s offered")
    soak.add_argument("--worlds", type=int, default=3)
    soak.add_argument("--keys", type=int, default=50_000)
    soak.add_argument("--workers", type=int, default=1)
    soak.add_argument("--out", type=Path, default=RESULTS)
    soak.add_argument(
        "--keep",
        action="store_true",
        help="keep the run's Nessie branches, Kafka topics and warehouse files (removed at the end by default)",
    )
    soak.add_argument(
        "--probe",
        type=Path,
        default=None,
        help="write the workers' memory holders every 30 s to this JSON-lines file (bench/memory_probe.py)",
    )
    soak.add_argument(
        "--drain-seconds",
        type=float,
        default=120.0,
        help="after the load, wait this long for the workers to catch up (0: stop at once; a short "
        "run that left the worker behind then skips the wait, and its late windows' latency is partial)",
    )
    dedupe_memory.add_parser(sub)
    args = ap.parse_args(argv)

    if args.cmd == "run":
        _run(_profile(args), args)
        return 0
    if args.cmd == "scale":
        return _scale(args)
    if args.cmd == "soak":
        from bench.soak import soak_main

        return soak_main(args)
    if args.cmd == "dedupe-memory":
        return dedupe_memory.main(args)
    return 2


def axis_points(axis: str, points: str | None) -> list[dict[str, object]]:
    """The axis's points: its defaults, or ``--points`` (values of the axis's knob, e.g. ``50000,500000``)."""
    if points is None:
        return SCALE_AXES[axis]
    try:
        values = [int(v.replace("_", "")) for v in points.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"--points: not a list of integers: {points!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"--points: give positive integers: {points!r}")
    return [{axis: v} for v in values]


def _scale(args: argparse.Namespace) -> int:
    """One run per point; every point's figures are collected into one table (printed and saved)."""
    if args.profile == "small":
        args.profile = "curve"
    started = datetime.now(UTC).isoformat(timespec="seconds")
    rows = []
    for point in axis_points(args.axis, args.points):
        print(f"== {args.axis}: {point}", flush=True)
        try:
            doc = _keys_point(point, args) if args.axis == "keys" else _run(_profile(args, **point), args)
        except (RuntimeError, TimeoutError) as exc:
            # a point whose processes died or never formed a group: the other points still run
            print(f"== {args.axis}: {point} FAILED: {exc}", flush=True)
            rows.append({"point": point, "failed": str(exc)[:300]})
            continue
        rows.append(scale_row(point, doc))
    table = scale_markdown(args.axis, rows)
    args.out.mkdir(parents=True, exist_ok=True)
    base = args.out / f"{started.replace(':', '').replace('-', '')}-scale-{args.axis}"
    summary = {"axis": args.axis, "started": started, "command": command_line(sys.argv)}
    base.with_suffix(".json").write_text(json.dumps(summary | {"points": rows}, indent=2, default=str))
    base.with_suffix(".md").write_text(table)
    print(table)
    print(f"scale: {base}.json\n       {base}.md")
    return 0


def _keys_point(point: dict[str, object], args: argparse.Namespace) -> dict:
    """One keys point: ``bench.keys_seeded`` (a seeded world, then updates through Kafka); its result JSON."""
    from bench import keys_seeded

    before = set(args.out.glob("*-keys-seeded-*.json"))
    argv = ["--keys", str(point["keys"]), "--out", str(args.out), "--updates", str(args.events or 100_000)]
    if args.latency_rate:
        argv += ["--latency-rate", str(args.latency_rate)]
    if getattr(args, "keep", False):
        argv.append("--keep")
    keys_seeded.main(argv)
    (new,) = set(args.out.glob("*-keys-seeded-*.json")) - before
    return json.loads(new.read_text())


if __name__ == "__main__":
    sys.exit(main())
