"""``python -m bench``: the benchmark harness (see docs/benchmarks.md).

    python -m bench run                       # the small profile: causeway, ceiling, naive; a few minutes
    python -m bench run --profile full        # 1M events, 10 worlds, 2 workers (long; not for CI)
    python -m bench run --events 100000 --worlds 100 --contenders causeway,ceiling
    python -m bench scale --axis workers      # the scaling curve along one axis (one run per point)
    python -m bench scale --axis keys         # 1M and 5M keys in one world (bench.keys_seeded)
    python -m bench soak --minutes 30         # causeway under steady load: commit latency and RSS flat?
    python -m bench dedupe-memory --marks 10000000   # Redis bytes per applied-event mark

Results go to bench/results/<time>-<profile>-<id>.json and .md; the table is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from bench import dedupe_memory
from bench.harness import RESULTS, Run, save
from bench.profiles import CONTENDERS, PROFILES, SCALE_AXES
from bench.report import markdown


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
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    _add_overrides(sub.add_parser("run", help="one run: every contender on the same input"))
    scale = sub.add_parser("scale", help="the scaling curve: one run per point of an axis")
    _add_overrides(scale)
    scale.add_argument("--axis", required=True, choices=sorted(SCALE_AXES))
    soak = sub.add_parser("soak", help="causeway under steady load; reports whether commit latency and RSS stay flat")
    soak.add_argument("--minutes", type=float, default=30.0)
    soak.add_argument("--rate", type=int, default=2_000, help="events/s offered")
    soak.add_argument("--worlds", type=int, default=3)
    soak.add_argument("--keys", type=int, default=50_000)
    soak.add_argument("--workers", type=int, default=1)
    soak.add_argument("--out", type=Path, default=RESULTS)
    dedupe_memory.add_parser(sub)
    args = ap.parse_args(argv)

    if args.cmd == "run":
        _run(_profile(args), args)
        return 0
    if args.cmd == "scale":
        if args.profile == "small":
            args.profile = "curve"
        points = []
        if args.axis == "keys":
            from bench import keys_seeded

            for point in SCALE_AXES["keys"]:
                print(f"== keys: {point}", flush=True)
                keys_seeded.main(["--keys", str(point["keys"]), "--out", str(args.out)])
            return 0
        for point in SCALE_AXES[args.axis]:
            print(f"== {args.axis}: {point}", flush=True)
            doc = _run(_profile(args, **point), args)
            points.append({"point": point, "contenders": {k: _headline(v) for k, v in doc["contenders"].items()}})
        print(json.dumps({"axis": args.axis, "points": points}, indent=2))
        return 0
    if args.cmd == "soak":
        from bench.soak import soak_main

        return soak_main(args)
    if args.cmd == "dedupe-memory":
        return dedupe_memory.main(args)
    return 2


def _headline(fig: dict) -> dict:
    keys = ("events_per_s", "latency_s", "peak_rss_mb", "cpu_s_per_1k_events", "rewrite_amplification", "commit_s")
    return {k: fig[k] for k in keys}


if __name__ == "__main__":
    sys.exit(main())
