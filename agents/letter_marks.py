"""Dead-letter decisions kept per origin: which records were dead-lettered already (pure; the Redis
I/O is ``agents.marks.DeadLetterMarks``).

A dead letter is published, confirmed, and only then may its Kafka offset be committed. A worker
killed in between leaves the record to be read again; deciding it again could let it take effect
(its cause arrived meanwhile) although its letter exists, or give it a second letter. So after a
letter is confirmed the applier records the decision under the record's origin (topic, partition,
offset) and, on intake, settles records whose origin is recorded without deciding them again.

Keys: ``causeway:dead:{<world>}:<topic>:<partition>:<offset>:<event id>`` when the record names a
valid world (the world is the hash tag, as for the applied marks; no ``:<event id>`` when it has
none), ``causeway:dead:{<topic>:<partition>}:<offset>`` when it names none or an invalid one. The
event id keeps a decision to its record when an offset is reused (a topic created again). Both
sides compute the key from the same bytes (the decoded world and event id), so they agree.

Per event too: a letter about a valid event (``EVENT_REASONS``: the gate's, the world check's and
the committer's decisions) is also recorded as ``causeway:dead-id:{<world>}:<redrive count>:<event
id>``, so a producer-retry copy of the event at another offset gets the same decision (settled, no
second letter) instead of one of its own. Decode failures are recorded per origin only: a
producer that fixes a bad record and sends it again under the same id is decided afresh. The
redrive count (header ``causeway.redrive_count``, set by ``dlq redrive``) is part of the key, so a
redriven record is decided afresh (applied once its cause landed), while copies of one redrive
share its decision.

A decision is written in two steps around the publish (``PENDING`` with the time, then
``CONFIRMED``): a record found *pending* on intake was being dead-lettered when its worker died,
and whether its letter went out is read from the dead-letter topic itself (``pending_since``,
then ``agents.deadletter_publisher.DeadLetterPublisher.letter_keys_since``), so it gets exactly one letter either way.
"""

from __future__ import annotations

import functools
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.causal import CAUSAL_CYCLE, CAUSE_MISSING, SELF_CAUSED
from agents.offset_tracker import Arrival
from models.deadletter import H_REDRIVE, DeadLetter
from models.worlds import InvalidWorldId, validate_world_id

log = logging.getLogger(__name__)

KEY_PREFIX = "causeway:dead:"
EVENT_KEY_PREFIX = "causeway:dead-id:"

#: Reasons that are decisions about a valid event (not about its bytes): recorded per event id too.
#: The applier's own codes are literals here (it imports this module); a unit test keeps them equal.
EVENT_REASONS = frozenset(
    {CAUSE_MISSING, CAUSAL_CYCLE, SELF_CAUSED, "unknown-world", "stale-version", "commit-failed", "world-unreadable"}
)

#: Values of a decision key: written before the publish, then after the broker confirmed it.
CONFIRMED = b"1"
PENDING = b"p:"

#: A pending decision's letter is looked for in the DLQ from this long before the recorded time
#: (clock skew between workers and the broker, ``LogAppendTime`` topics).
PENDING_MARGIN_MS = 300_000

Origin = tuple[str, int, int]
"""(topic, partition, offset): where a record was read."""


def dead_key(origin: Origin, world_id: str | None, event_id: str | None = None) -> str:
    """The Redis key recording that the record at ``origin`` was dead-lettered.

    With the record's event id when it has one: an offset is reused when a topic is deleted and
    created again (or a cluster's data is reset) while Redis keeps the decisions for their TTL, and
    a decision keyed by the origin alone then settled the new record read there without applying or
    dead-lettering it (a valid event lost; seen here after the broker's data was reset).
    """
    topic, partition, offset = origin
    world = _valid_world(world_id) if type(world_id) is str else None
    if world is None:
        return f"{KEY_PREFIX}{{{topic}:{partition}}}:{offset}"
    suffix = f":{event_id}" if event_id else ""
    return f"{KEY_PREFIX}{{{world}}}:{topic}:{partition}:{offset}{suffix}"


@functools.lru_cache(maxsize=4096)
def _valid_world(world_id: str) -> str | None:
    """``world_id`` if valid, else None: every decoded record's key asks (the pattern match and the
    exception of an invalid one cost ~1 µs a record), and a worker sees a handful of worlds."""
    try:
        return validate_world_id(world_id)
    except InvalidWorldId:
        return None


def event_key(world_id: str, event_id: str, redrive: int = 0) -> str:
    """The Redis key recording that event ``event_id`` (as redriven ``redrive`` times) was dead-lettered."""
    return f"{EVENT_KEY_PREFIX}{{{world_id}}}:{redrive}:{event_id}"


def redrive_count(headers: Iterable[tuple[str, bytes | None]]) -> int:
    """The record's ``causeway.redrive_count`` header (0 when absent or unreadable)."""
    for k, v in headers:
        if k == H_REDRIVE:
            try:
                return int(v or b"0")
            except ValueError:
                return 0
    return 0


def letter_key(letter: DeadLetter) -> str:
    return dead_key((letter.topic, letter.partition, letter.offset), letter.world_id, letter.event_id)


def letter_keys(letter: DeadLetter) -> list[str]:
    """Every key a confirmed letter records: its origin, and its event when it is a decision about one."""
    keys = [letter_key(letter)]
    if letter.reason in EVENT_REASONS and letter.event_id:
        try:
            world = validate_world_id(letter.world_id)
        except InvalidWorldId:
            return keys
        keys.append(event_key(world, letter.event_id, letter.redrive_count))
    return keys


def arrival_key(arrival: Arrival) -> str:
    return dead_key((arrival.topic, arrival.partition, arrival.offset), arrival.event.world_id, arrival.event.event_id)


def arrival_keys(arrival: Arrival, redrive: int = 0) -> list[str]:
    """Keys that settle a decoded record: its origin's decision, or its event's (a copy's)."""
    ev = arrival.event
    return [arrival_key(arrival), event_key(ev.world_id, ev.event_id, redrive)]


@dataclass(slots=True)
class WorldLookup:
    """The decision keys of one world's decoded records in a batch, as the parts the lookup script
    joins (``agents.marks.DeadLetterMarks.arrival_states``): record ``i``'s origin key is
    ``origin_prefix + origins[i] + ":" + ids[i]``, its event key ``event_prefix + redrive + ":" +
    ids[i]``. Built per world rather than as two keys a record: formatting each key, re-reading its
    hash tag to group it (``by_tag``) and packing it cost ~11 % of the event loop on a worker
    (docs/benchmarks.md, 2026-12-02 early morning), for a lookup that almost never finds anything."""

    origin_prefix: str
    event_prefix: str
    ids: list[str] = field(default_factory=list)
    #: ``"<topic>:<partition>:<offset>"`` of each record.
    origins: list[str] = field(default_factory=list)
    #: Each record's redrive count; None: all 0 (most batches).
    redrives: list[int] | None = None

    def origin_key(self, i: int) -> str:
        return f"{self.origin_prefix}{self.origins[i]}:{self.ids[i]}"

    def event_key(self, i: int) -> str:
        return f"{self.event_prefix}{self.redrives[i] if self.redrives else 0}:{self.ids[i]}"

    def keys(self) -> list[str]:
        """Every key the lookup reads (for a store without the script, and tests): per record its
        origin's, then its event's; the same keys ``arrival_keys`` gives."""
        return [k for i in range(len(self.ids)) for k in (self.origin_key(i), self.event_key(i))]


def world_lookups(
    arrivals: Iterable[Arrival], redrives: Mapping[tuple[str, int, int], int] | None = None
) -> dict[str, WorldLookup]:
    """The decision keys of decoded records by world (``WorldLookup``); ``redrives``: the redrive
    count of each origin that has one. A decoded record's world is valid (``models.events`` checked
    it), so its origin key is the per-world one of ``dead_key``."""
    out: dict[str, WorldLookup] = {}
    tps: dict[tuple[str, int], str] = {}
    for a in arrivals:
        ev, src = a.event, a.source
        world = ev.world_id
        look = out.get(world)
        if look is None:
            look = out[world] = WorldLookup(f"{KEY_PREFIX}{{{world}}}:", f"{EVENT_KEY_PREFIX}{{{world}}}:")
        tp = (src.topic, src.partition)
        head = tps.get(tp)
        if head is None:
            head = tps[tp] = f"{src.topic}:{src.partition}:"
        if redrives:
            n = redrives.get((src.topic, src.partition, src.offset), 0)
            if n and look.redrives is None:
                look.redrives = [0] * len(look.ids)
            if look.redrives is not None:
                look.redrives.append(n)
        look.ids.append(ev.event_id)
        look.origins.append(head + str(src.offset))
    return out


def pending(now_ms: int) -> bytes:
    return PENDING + str(now_ms).encode()


def pending_since(states: Mapping[str, bytes]) -> int | None:
    """The earliest time (ms) any of ``states`` was written pending, less the margin; None if none is."""
    times = [int(v[len(PENDING) :] or 0) for v in states.values() if v.startswith(PENDING)]
    return min(times) - PENDING_MARGIN_MS if times else None


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


def split_replays(
    arrivals: Sequence[Arrival],
    letters: Sequence[DeadLetter],
    recorded: Collection[str],
    redrives: Mapping[tuple[str, int, int], int] | None = None,
) -> Replays:
    """Split decoded arrivals and fresh letters into new ones and replays of a recorded letter
    (``redrives``: the redrive count of each arrival's origin, when not 0)."""
    out = Replays()
    redrives = redrives or {}
    for a in arrivals:
        origin = (a.topic, a.partition, a.offset)
        if any(k in recorded for k in arrival_keys(a, redrives.get(origin, 0))):
            out.replayed.append((a.event.world_id, origin))
        else:
            out.arrivals.append(a)
    for dl in letters:
        if letter_key(dl) in recorded:
            out.replayed.append((dl.world_id, (dl.topic, dl.partition, dl.offset)))
        else:
            out.letters.append(dl)
    return out


class DecisionStore(Protocol):
    async def states(self, keys: Any, worlds: Mapping[str, WorldLookup] | None = None) -> dict[str, bytes]: ...
    async def record(self, keys: Any, value: bytes = ...) -> int: ...
    async def forget(self, states: Mapping[str, bytes]) -> int: ...


LetterScan = Callable[[int], Awaitable[set[str]]]
"""Decision keys of the letters in the DLQ topic since a time (ms): ``DeadLetterPublisher.letter_keys_since``."""


class Decisions:
    """The one primitive every dead-lettering path uses (applier, replay, CDC ingest): which
    decisions were taken already, and recording new ones around their publish.

    ``store``: the Redis half (``agents.marks.DeadLetterMarks``); ``scan``: reads the DLQ topic to
    settle decisions found pending (None: a pending decision is decided again).
    """

    def __init__(self, store: DecisionStore, scan: LetterScan | None = None) -> None:
        self.store = store
        self.scan = scan
        self.pending_found = 0
        self.pending_redecided = 0

    async def taken(self, keys: Sequence[str], worlds: Mapping[str, WorldLookup] | None = None) -> set[str]:
        """Which of ``keys`` and of ``worlds``' keys (decoded records, ``world_lookups``) are
        decided: confirmed, or pending with their letter in the DLQ (then confirmed now). One Redis
        round trip; the DLQ is read only when a decision is pending."""
        if not keys and not worlds:
            return set()
        states = await self.store.states(keys, worlds) if worlds else await self.store.states(keys)
        taken = {k for k, v in states.items() if v == CONFIRMED}
        since = pending_since(states)
        if since is None:
            return taken
        open_keys = set(states) - taken
        found = open_keys & await self.scan(since) if self.scan is not None else set()
        if found:
            await self.store.record(found, CONFIRMED)
        void = {k: states[k] for k in open_keys - found}
        if void:
            # The letter never went out: the decision is void and the record is decided afresh
            # (recorded again if it is dead-lettered again). Left pending, every later lookup of the
            # key (a redelivery before the offset commit, a producer-retry copy) would read the DLQ
            # again until the TTL, although the record was applied or settled meanwhile. Deleted
            # only if still as read (a decision confirmed since by a live worker stays).
            await self.store.forget(void)
        self.pending_found += len(found)
        self.pending_redecided += len(void)
        log.info(
            "%d dead-letter decision(s) found pending: %d letter(s) in the DLQ (settled), %d decided again",
            len(open_keys),
            len(found),
            len(open_keys - found),
        )
        return taken | found

    async def publishing(self, letters: Sequence[DeadLetter], now_ms: int) -> list[str]:
        """Record ``letters``' decisions as pending before they are published; returns their keys."""
        keys = [k for dl in letters for k in letter_keys(dl)]
        if keys:
            await self.store.record(keys, pending(now_ms))
        return keys

    async def published(self, keys: Sequence[str]) -> None:
        """The broker confirmed the letters: their decisions stand."""
        if keys:
            await self.store.record(keys, CONFIRMED)
