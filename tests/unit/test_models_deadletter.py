"""The dead-letter record: built from a rejected record, and read back from the DLQ topic."""

from __future__ import annotations

from dataclasses import dataclass

from models.deadletter import H_FIRST_SEEN, H_REASON, DeadLetter


@dataclass(frozen=True)
class Rec:
    topic: str = "cdc.raw.s.t"
    partition: int = 2
    offset: int = 41
    key: bytes | None = b"k"
    value: bytes | None = b"x" * 10


def test_a_rejected_record_keeps_its_bytes_and_headers_and_round_trips() -> None:
    dl = DeadLetter.of_record(
        Rec(), "bad-world-id", "no such world", world_id="w1", headers=[("trace", b"t1")], first_seen_ms=7
    )
    assert (dl.topic, dl.partition, dl.offset, dl.key, dl.value) == ("cdc.raw.s.t", 2, 41, b"k", b"x" * 10)
    assert (H_REASON, b"bad-world-id") in dl.headers() and (H_FIRST_SEEN, b"7") in dl.headers()
    back = DeadLetter.from_record(dl.key, dl.value, dl.headers())
    assert back == dl


def test_a_value_over_the_limit_travels_without_its_bytes_and_says_where_it_is() -> None:
    dl = DeadLetter.of_record(Rec(), "too-large", "too big", max_value_bytes=9)
    assert dl.value is None and dl.key == b"k"
    assert dl.detail == "too big (value of 10 bytes omitted; re-read it from cdc.raw.s.t/2@41)"
    assert DeadLetter.of_record(Rec(), "too-large", "fits", max_value_bytes=10).value == b"x" * 10
