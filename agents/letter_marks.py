"""Dead-letter decisions kept per origin: which records were dead-lettered already (pure; the Redis
I/O is ``agents.marks.DeadLetterMarks``).

A dead letter is published, confirmed, and only then may its Kafka offset be committed. A worker
killed in between leaves the record to be read again; deciding it again could let it take effect
(its cause arrived meanwhile) although its letter exists, or give it a second letter. So after a
letter is confirmed the applier records the decision under the record's origin (topic, partition,
offset) and, on intake, settles records whose origin is recorded without deciding them again.

Keys: ``causeway:dead:{<world>}:<topic>:<partition>:<offset>`` when the record names a valid world
(the world is the hash tag, as for the applied marks), ``causeway:dead:{<topic>:<partition>}:<offset>``
when it names none or an invalid one. Both sides compute the key from the same bytes (the decoded
world), so they agree. A ``dlq redrive`` publishes a new record at a new offset: a new origin,
decided afresh.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from agents.offset_tracker import Arrival
from models.deadletter import DeadLetter
from models.worlds import InvalidWorldId, validate_world_id

KEY_PREFIX = "causeway:dead:"

Origin = tuple[str, int, int]
"""(topic, partition, offset): where a record was read."""


def dead_key(origin: Origin, world_id: str | None) -> str:
    """The Redis key recording that the record at ``origin`` was dead-lettered."""
    topic, partition, offset = origin
    try:
        world = validate_world_id(world_id)
    except InvalidWorldId:
        return f"{KEY_PREFIX}{{{topic}:{partition}}}:{offset}"
    return f"{KEY_PREFIX}{{{world}}}:{topic}:{partition}:{offset}"


def letter_key(letter: DeadLetter) -> str:
    return dead_key((letter.topic, letter.partition, letter.offset), letter.world_id)


def arrival_key(arrival: Arrival) -> str:
    return dead_key((arrival.topic, arrival.partition, arrival.offset), arrival.event.world_id)


def by_tag(keys: Iterable[str], chunk: int) -> list[list[str]]:
    """Unique keys grouped by hash tag (one Redis Cluster slot each), in chunks of at most ``chunk``."""
    grouped: dict[str, dict[str, None]] = defaultdict(dict)
    for key in keys:
        grouped[key[key.index("{") : key.index("}") + 1]][key] = None
    out: list[list[str]] = []
    for same in grouped.values():
        listed = list(same)
        out += [listed[i : i + chunk] for i in range(0, len(listed), chunk)]
    return out


@dataclass
class Replays:
    """A consumed batch split by the recorded decisions: what to decide, and what was decided before."""

    arrivals: list[Arrival] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)
    #: Records dead-lettered before (by this or an earlier owner): settle them, publish nothing.
    replayed: list[tuple[str | None, Origin]] = field(default_factory=list)


def split_replays(arrivals: Sequence[Arrival], letters: Sequence[DeadLetter], recorded: set[str]) -> Replays:
    """Split decoded arrivals and fresh letters into new ones and replays of a recorded letter."""
    out = Replays()
    for a in arrivals:
        if arrival_key(a) in recorded:
            out.replayed.append((a.event.world_id, (a.topic, a.partition, a.offset)))
        else:
            out.arrivals.append(a)
    for dl in letters:
        if letter_key(dl) in recorded:
            out.replayed.append((dl.world_id, (dl.topic, dl.partition, dl.offset)))
        else:
            out.letters.append(dl)
    return out
