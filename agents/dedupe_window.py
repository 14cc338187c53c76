"""Where an applied-event mark lives in Redis: a bounded window of compact buckets (pure, no I/O).

Marks cover a *window* (``dedupe_window_s``: producer retries and redeliveries happen within
minutes; the window is hours), not the event's whole life. Older duplicates are caught by the
branch's own event log (``agents.dedupe``, ``sinks.committer``): the window bounds Redis memory at
``rate × (window + slot) × bytes per mark`` instead of growing for a week.

Layout, per world (the world is the hash tag: all of a world's mark keys share one cluster slot)::

    causeway:marks:{<world>}:<slot>:<family><bucket>

* ``slot``: wall-clock time divided into ``SLOTS_PER_WINDOW`` slots per window; a mark goes into
  the slot of the time it is written, its key expires at the slot's end plus the window, so a mark
  lives at least ``window`` and at most ``window + slot`` seconds. A lookup reads every slot that
  may still hold a mark younger than the window.
* ``bucket``: ``crc32(event id) mod buckets``; one key holds about ``events per slot / buckets``
  marks, which Redis stores compactly while they stay small (a listpack for a hash, one allocation
  for a string). Fewer slots mean fewer keys per lookup (each id reads its bucket in every live
  slot), more slots a tighter bound on memory: two slots per window read 3 keys per bucket.
* ``family`` and the stored bytes, exact (the whole id, never a digest, so no false positive):
  ``u``: a canonical UUID, packed to its 16 bytes; ``c``: a CDC id (``cdc-`` + 32 hex), packed to
  16 bytes. Packed ids are concatenated in one string per bucket (16 bytes per mark, found by a
  search aligned to 16 bytes). ``s``: any other id, stored as a field of a hash (its UTF-8 bytes).
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass

PREFIX = "causeway:marks:"
SLOTS_PER_WINDOW = 2  # a lookup reads 3 slots; a mark lives window to 1.5 × window
PACKED = 16  # bytes of a packed id
#: The stored forms of an id (see the module doc): UUID, CDC id, any other.
FAMILIES = ("u", "c", "s")

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_CDC = re.compile(r"cdc-[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class Encoded:
    """An event id as stored: its family (``u``, ``c``: packed bytes in a string; ``s``: a hash field)."""

    family: str
    data: bytes

    @property
    def packed(self) -> bool:
        return self.family != "s"


def encode(event_id: str) -> Encoded:
    """The exact stored form of an event id; ``decode`` gives the id back."""
    if len(event_id) == 36 and _UUID.fullmatch(event_id):
        return Encoded("u", bytes.fromhex(event_id.replace("-", "")))
    if len(event_id) == 36 and _CDC.fullmatch(event_id):
        return Encoded("c", bytes.fromhex(event_id[4:]))
    return Encoded("s", event_id.encode())


def decode(enc: Encoded) -> str:
    if enc.family == "u":
        h = enc.data.hex()
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    if enc.family == "c":
        return "cdc-" + enc.data.hex()
    return enc.data.decode()


@dataclass(frozen=True, slots=True)
class MarkWindow:
    """The window's arithmetic: which slot a mark goes to, when it expires, which slots a lookup reads."""

    window_s: int
    buckets: int
    prefix: str = PREFIX

    def __post_init__(self) -> None:
        if self.window_s < SLOTS_PER_WINDOW:
            raise ValueError(f"the dedupe window must be at least {SLOTS_PER_WINDOW} s")
        if self.buckets < 1:
            raise ValueError("buckets must be at least 1")

    @property
    def slot_s(self) -> int:
        return math.ceil(self.window_s / SLOTS_PER_WINDOW)

    def slot(self, now: float) -> int:
        return int(now // self.slot_s)

    def expire_at(self, slot: int) -> int:
        """Unix time a slot's keys expire: the slot's end plus the window."""
        return (slot + 1) * self.slot_s + self.window_s

    def live_slots(self, now: float) -> list[int]:
        """Slots that may hold a mark written less than ``window_s`` ago, newest first."""
        newest, oldest = self.slot(now), self.slot(now - self.window_s)
        return list(range(newest, oldest - 1, -1))

    def bucket(self, event_id: str) -> int:
        return zlib.crc32(event_id.encode()) % self.buckets

    def place(self, event_id: str) -> tuple[str, bytes, int]:
        """``(family, stored bytes, bucket)`` of an id: ``encode`` and ``bucket`` in one pass (the
        hot path places every id of a batch; most ids are not UUIDs and need no pattern match)."""
        raw = event_id.encode()
        bucket = zlib.crc32(raw) % self.buckets
        if len(event_id) == 36:
            enc = encode(event_id)
            return enc.family, enc.data, bucket
        return "s", raw, bucket

    def groups(self, ids: list[str]) -> list[tuple[tuple[str, int], tuple[list[str], list[bytes]]]]:
        """The ids by (family, bucket), each with its ids and stored bytes, in first-seen order: what
        ``place`` gives one id at a time, for a batch. Ids that cannot be packed (any id not 36
        characters long) take ``place``'s plain-text rule inline, grouped by their bucket alone: no
        call and no tuple key an id (the marks' lookup and mark call group every id of a poll)."""
        groups: dict[int | tuple[str, int], tuple[list[str], list[bytes]]] = {}
        place, n_buckets = self.place, self.buckets
        for event_id in ids:
            if len(event_id) == 36:
                family, data, bucket = place(event_id)
                group: int | tuple[str, int] = bucket if family == "s" else (family, bucket)
            else:
                data = event_id.encode()
                group = zlib.crc32(data) % n_buckets
            entry = groups.get(group)
            if entry is None:
                entry = groups[group] = ([], [])
            entry[0].append(event_id)
            entry[1].append(data)
        return [(("s", g) if type(g) is int else g, entry) for g, entry in groups.items()]  # type: ignore[misc]

    def key(self, world: str, slot: int, family: str, bucket: int) -> str:
        return self.key_prefix(world, slot, family) + f"{bucket:x}"

    def key_prefix(self, world: str, slot: int, family: str) -> str:
        """``key(world, slot, family, b)`` is this plus ``bucket_names()[b]``: a batch builds one key
        per bucket and live slot (a lookup of small polls about three a id), and the formatted key
        cost ~0.35 µs against ~0.06 for the concatenation."""
        return f"{self.prefix}{{{world}}}:{slot}:{family}"

    def bucket_names(self) -> list[str]:
        """Every bucket's number as its key writes it, by bucket."""
        return [f"{b:x}" for b in range(self.buckets)]

    def bytes_held(self, rate: float, bytes_per_mark: float) -> float:
        """Redis memory the marks of one world take at a steady ``rate`` (events/s): the docs' formula."""
        return rate * (self.window_s + self.slot_s) * bytes_per_mark
