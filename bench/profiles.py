"""Named benchmark profiles: the workload, the contenders' knobs and the time caps of a run.

``tiny`` is for the smoke test, ``small`` is the default (a few minutes on a 2-core box), ``full``
and the ``curve-*`` / ``soak`` profiles are documented in docs/benchmarks.md and not run in CI.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cli.workload import WorkloadParams

CONTENDERS = ("ceiling", "causeway", "naive")


@dataclass(frozen=True)
class Profile:
    name: str
    events: int  # preloaded records (duplicates and bad input included)
    worlds: int
    keys: int  # objects per world
    workers: int = 1  # causeway worker processes
    partitions: int = 4
    seed: int = 7
    update_share: float = 0.6
    delete_share: float = 0.05
    link_share: float = 0.15
    causal_share: float = 0.1
    late_cause_share: float = 0.5
    duplicate_rate: float = 0.02
    bad_rate: float = 0.01
    contenders: tuple[str, ...] = CONTENDERS
    debezium: bool = False  # publish Debezium envelopes and run the CDC ingest in front of causeway
    # causeway worker settings (production defaults unless a profile needs otherwise)
    batch_max_events: int = 10_000
    batch_max_seconds: float = 1.0
    # naive: events per Nessie commit (1 = a commit per event), and its time cap for the preload
    naive_batch: int = 10
    naive_cap_s: float = 60.0
    # ceiling: records per getmany (one append per world per batch)
    ceiling_batch: int = 10_000
    # the latency phase: records published at this steady rate after the preload drained
    latency_rate: int = 1_000
    latency_seconds: float = 10.0
    latency_drain_s: float = 30.0  # how long to wait for the paced records to become visible
    # further latency phases after the first, one per rate, each ``latency_seconds`` long with fresh keys
    extra_latency_rates: tuple[int, ...] = ()
    stall_after_s: float = 60.0  # causeway / ceiling: no committed progress for this long = stalled
    drain_timeout_s: float = 300.0  # causeway / ceiling: give up draining the preload after this (a stall)

    def with_(self, **changes: object) -> Profile:
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})  # type: ignore[arg-type]

    def workload(self, world_prefix: str, id_prefix: str, events: int | None = None) -> WorkloadParams:
        """The workload generator's parameters for this profile (its mix, keys and seed)."""
        from cli.workload import WorkloadParams

        return WorkloadParams(
            events=events or self.events,
            worlds=self.worlds,
            keys=self.keys,
            seed=self.seed,
            update_share=self.update_share,
            delete_share=self.delete_share,
            link_share=self.link_share,
            causal_share=self.causal_share,
            late_cause_share=self.late_cause_share,
            duplicate_rate=self.duplicate_rate,
            bad_rate=self.bad_rate,
            world_prefix=world_prefix,
            id_prefix=id_prefix,
        )


PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile(
            "tiny",
            events=1_500,
            worlds=2,
            keys=100,
            naive_cap_s=10,
            latency_rate=200,
            latency_seconds=3,
            latency_drain_s=10,
            extra_latency_rates=(400,),
            drain_timeout_s=60,
        ),
        Profile(
            "small",
            events=50_000,
            worlds=3,
            keys=5_000,
            naive_cap_s=45,
            latency_rate=1_000,
            latency_seconds=10,
            extra_latency_rates=(5_000,),
        ),
        Profile(
            "full",
            events=1_000_000,
            worlds=10,
            keys=100_000,
            workers=2,
            naive_cap_s=300,
            latency_rate=10_000,
            latency_seconds=60,
            latency_drain_s=60,
            drain_timeout_s=3_600,
        ),
        # The scaling curve: `python -m bench scale --axis events|worlds|workers|keys` varies one knob.
        Profile(
            "curve", events=100_000, worlds=10, keys=10_000, naive_cap_s=60, latency_rate=5_000, latency_seconds=20
        ),
        # One world, update-heavy, keys drawn from 1M. The demo workload creates a key for only ~20 % of
        # its events at this mix, so 2M records hold ~370k keys; the harness keeps every record in
        # memory (~5 KB each: 11 GB here). 1M and 5M keys: `python -m bench.keys_seeded --keys N`.
        Profile(
            "keys-1m",
            events=2_000_000,
            worlds=1,
            keys=1_000_000,
            update_share=0.8,
            link_share=0.05,
            contenders=("ceiling", "causeway"),
            latency_rate=10_000,
            latency_seconds=30,
            drain_timeout_s=3_600,
        ),
    )
}

SCALE_AXES: dict[str, list[dict[str, object]]] = {
    "events": [{"events": 100_000}, {"events": 1_000_000}],
    "worlds": [{"worlds": 1}, {"worlds": 10}, {"worlds": 100}],
    "workers": [{"workers": 1}, {"workers": 2}, {"workers": 3}],
    # a world seeded with this many objects, then updates through Kafka (bench.keys_seeded)
    "keys": [{"keys": 1_000_000}, {"keys": 5_000_000}],
}
