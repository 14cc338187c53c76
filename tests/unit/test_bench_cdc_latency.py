"""``bench run --debezium`` measures its latency phase: envelopes are traced to their change events."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.cdc_latency import envelope_index, latency_offsets
from cdc.mapping_loader import load_mapping
from cdc.plan import plan_batch
from cli.workload import Workload, WorkloadParams, debezium_mapping, debezium_records, generate
from streams.settings import Settings


@dataclass
class Raw:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)


def test_every_latency_envelope_is_traced_to_the_change_event_made_from_it() -> None:
    params = WorkloadParams(events=300, worlds=2, keys=60, seed=3, duplicate_rate=0.0, bad_rate=0.0, pk_prefix="lat")
    envelopes = debezium_records(Workload(params, generate(params).records), "benchx")
    # What the harness's publish returns, in envelope order: position → (publish time ms, bytes).
    sent = {(e.topic, 0, i): (1_000 + i, len(e.value)) for i, e in enumerate(envelopes)}
    raws = [Raw(e.topic, 0, i, e.key, e.value) for i, e in enumerate(envelopes)]

    # The real ingest conversion makes the change events; give them change-topic offsets.
    settings = Settings(objects_topic="objs", links_topic="links", dlq_topic="dlq")
    plan = plan_batch(raws, load_mapping(debezium_mapping("benchx")), settings, now_ms=0)
    assert plan.events == len(envelopes) and not plan.rejected
    changes = [(o.topic, 0, n, o.value) for n, o in enumerate(plan.outgoing) if o.value is not None]

    paced = latency_offsets(changes, envelope_index(envelopes, sent))
    assert len(paced) == len(envelopes)  # every envelope found, none twice
    # Each envelope makes one event here, in order: the n-th change carries the n-th envelope's time.
    assert paced == {(topic, 0, n): (1_000 + n, len(envelopes[n].value)) for topic, _, n, _ in changes}
