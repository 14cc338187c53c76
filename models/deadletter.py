"""Dead letters: a rejected record, unchanged, plus headers that say why and where it came from.

The value and key are the original bytes, so a redrive re-publishes exactly what the producer sent.
Headers (all UTF-8 strings)::

    causeway.reason          stable reason code (e.g. malformed-json, bad-world-id, cause-missing)
    causeway.detail          a sentence the producer can act on (at most 1,000 characters)
    causeway.source.topic    topic the record was read from
    causeway.source.partition
    causeway.source.offset
    causeway.first_seen_ms   when causeway first rejected it (kept across redrives)
    causeway.event_id        when one could be read
    causeway.world_id        when one could be read
    causeway.redrive_count   how many times an operator re-published it

The original record's own headers are kept, after ours.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

H_REASON = "causeway.reason"
H_DETAIL = "causeway.detail"
H_TOPIC = "causeway.source.topic"
H_PARTITION = "causeway.source.partition"
H_OFFSET = "causeway.source.offset"
H_FIRST_SEEN = "causeway.first_seen_ms"
H_EVENT_ID = "causeway.event_id"
H_WORLD_ID = "causeway.world_id"
H_REDRIVE = "causeway.redrive_count"
OUR_PREFIX = "causeway."

Headers = list[tuple[str, bytes]]


class SourceRecord(Protocol):
    """What a dead letter needs of the record it rejects (aiokafka's ConsumerRecord has it)."""

    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...


@dataclass(frozen=True, slots=True)
class DeadLetter:
    reason: str
    detail: str
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    event_id: str | None = None
    world_id: str | None = None
    first_seen_ms: int = field(default_factory=lambda: int(time.time() * 1000))
    redrive_count: int = 0
    original_headers: Headers = field(default_factory=list)

    def headers(self) -> Headers:
        out: Headers = [
            (H_REASON, self.reason.encode()),
            (H_DETAIL, self.detail[:1000].encode()),
            (H_TOPIC, self.topic.encode()),
            (H_PARTITION, str(self.partition).encode()),
            (H_OFFSET, str(self.offset).encode()),
            (H_FIRST_SEEN, str(self.first_seen_ms).encode()),
            (H_REDRIVE, str(self.redrive_count).encode()),
        ]
        if self.event_id:
            out.append((H_EVENT_ID, self.event_id.encode()))
        if self.world_id:
            out.append((H_WORLD_ID, self.world_id[:100].encode()))
        out.extend((k, v) for k, v in self.original_headers if not k.startswith(OUR_PREFIX))
        return out

    @classmethod
    def of_record(
        cls,
        rec: SourceRecord,
        reason: str,
        detail: str,
        *,
        event_id: str | None = None,
        world_id: str | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        first_seen_ms: int | None = None,
        max_value_bytes: int | None = None,
    ) -> DeadLetter:
        """The dead letter of ``rec``, rejected for ``reason``: its key, value and ``headers`` unchanged.

        A value over ``max_value_bytes`` travels without its bytes; the detail says where to re-read it.
        """
        value = rec.value
        if value is not None and max_value_bytes is not None and len(value) > max_value_bytes:
            where = f"{rec.topic}/{rec.partition}@{rec.offset}"
            detail = f"{detail} (value of {len(value)} bytes omitted; re-read it from {where})"
            value = None
        return cls(
            reason=reason,
            detail=detail,
            topic=rec.topic,
            partition=rec.partition,
            offset=rec.offset,
            key=rec.key,
            value=value,
            event_id=event_id,
            world_id=world_id,
            first_seen_ms=int(time.time() * 1000) if first_seen_ms is None else first_seen_ms,
            original_headers=list(headers),
        )

    @classmethod
    def from_record(
        cls, key: bytes | None, value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
    ) -> DeadLetter:
        """Read a dead letter back from the DLQ topic (for `causeway dlq` and redrive)."""
        h = {k: (v or b"").decode("utf-8", "replace") for k, v in headers}
        return cls(
            reason=h.get(H_REASON, "unknown"),
            detail=h.get(H_DETAIL, ""),
            topic=h.get(H_TOPIC, ""),
            partition=int(h.get(H_PARTITION, "-1") or -1),
            offset=int(h.get(H_OFFSET, "-1") or -1),
            key=key,
            value=value,
            event_id=h.get(H_EVENT_ID) or None,
            world_id=h.get(H_WORLD_ID) or None,
            first_seen_ms=int(h.get(H_FIRST_SEEN, "0") or 0),
            redrive_count=int(h.get(H_REDRIVE, "0") or 0),
            original_headers=[(k, v or b"") for k, v in headers if not k.startswith(OUR_PREFIX)],
        )
