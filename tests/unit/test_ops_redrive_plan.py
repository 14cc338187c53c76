"""Dead-letter filters and redrive decisions (pure)."""

from __future__ import annotations

import dataclasses

from models.deadletter import H_REDRIVE, DeadLetter
from models.events import ChangeType, EntityKind
from ops.redrive.plan import H_REDRIVEN_FROM, DlqFilter, DlqRecord, causes_wanted, collapse, decide, redrive_headers
from tests.factories import change_event

EV = change_event("e-1", world="w1", entity_type="Sensor", pk="pk", change=ChangeType.CREATE, after={"x": 1}, source="")


def _rec(
    reason: str = "unknown-world", value: bytes | None = None, topic: str = "objs", redrives: int = 0
) -> DlqRecord:
    letter = DeadLetter(
        reason,
        "detail",
        topic,
        2,
        40,
        EV.key.encode(),
        EV.encode() if value is None else value,
        EV.event_id,
        EV.world_id,
        first_seen_ms=1000,
        redrive_count=redrives,
        original_headers=[("trace", b"abc")],
    )
    return DlqRecord(0, 17, 1000, letter)


def _decide(rec: DlqRecord, **kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {
        "kind": EntityKind.OBJECT,
        "max_bytes": 1_000_000,
        "applied": set(),
        "worlds_present": {"w1"},
        "redriven": set(),
    }
    args.update(kw)
    return decide(rec, **args)  # type: ignore[arg-type]


def test_filter() -> None:
    rec = _rec()
    assert DlqFilter().matches(rec)
    assert DlqFilter(reasons=("unknown-world",), worlds=("w1",), topics=("objs",), refs=("0:17",)).matches(rec)
    assert not DlqFilter(reasons=("malformed-json",)).matches(rec)
    assert not DlqFilter(since_ms=1001).matches(rec)
    assert DlqFilter(until_ms=1001, event_ids=("e-1",)).matches(rec)


def test_decisions() -> None:
    assert _decide(_rec()).action == "redrive"
    assert _decide(_rec(), worlds_present=set()).action == "world-missing"
    assert _decide(_rec(), worlds_present=set(), force=True).action == "redrive"
    assert _decide(_rec(), applied={("w1", "e-1")}).action == "applied"
    assert _decide(_rec(), redriven={"0:17"}).action == "already-redriven"
    assert _decide(_rec(), redriven={"0:17"}, again=True).action == "redrive"
    bad = _rec("malformed-json", value=b"{nope")
    assert _decide(bad).action == "invalid"
    assert _decide(bad, force=True).action == "redrive"
    assert _decide(_rec(topic="")).action == "no-origin"
    # A stale-version letter of an existing world is sent (the world check is only for unknown-world).
    assert _decide(_rec("stale-version"), worlds_present=set()).action == "redrive"


def test_redrive_headers_keep_originals_and_count_up() -> None:
    headers = dict(redrive_headers(_rec(redrives=2), "dlq.t"))
    assert headers["trace"] == b"abc"
    assert headers[H_REDRIVE] == b"3"
    assert headers[H_REDRIVEN_FROM] == b"dlq.t/0@17"
    assert "causeway.reason" not in headers


def _copy(rec: DlqRecord, dlq_offset: int, reason: str | None = None) -> DlqRecord:
    letter = dataclasses.replace(rec.letter, reason=reason or rec.letter.reason)
    return DlqRecord(rec.partition, dlq_offset, rec.timestamp_ms + 1, letter)


def test_letters_with_the_same_origin_are_one_letter() -> None:
    first = _rec()
    again = _copy(first, 30)  # the same source record dead-lettered again after a crash
    other_letter = dataclasses.replace(first.letter, offset=41)
    other = DlqRecord(0, 31, 1000, other_letter)
    no_origin = DlqRecord(0, 32, 1000, dataclasses.replace(first.letter, topic=""))
    twin_no_origin = DlqRecord(0, 33, 1000, dataclasses.replace(first.letter, topic=""))
    got = collapse([first, again, other, no_origin, twin_no_origin])
    assert [r.ref for r in got] == ["0:17", "0:31", "0:32", "0:33"]
    assert got[0].copies == ("0:30",) and got[0].refs == ("0:17", "0:30")
    # A filter on a copy's position finds the letter; a redrive of either position counts for both.
    assert DlqFilter(refs=("0:30",)).matches(got[0])
    assert _decide(got[0], redriven={"0:30"}).action == "already-redriven"
    assert _decide(got[0]).action == "redrive"


def test_a_cause_missing_letter_is_refused_while_its_cause_is_nowhere() -> None:
    effect = dataclasses.replace(EV, event_id="e-2", caused_by="c-1")
    letter = dataclasses.replace(_rec("cause-missing").letter, value=effect.encode(), event_id="e-2")
    rec = DlqRecord(0, 18, 1000, letter)
    refused = _decide(rec)
    assert refused.action == "cause-missing" and "c-1" in refused.detail
    assert _decide(rec, causes_present={("w1", "c-1")}).action == "redrive"
    assert _decide(rec, force=True).action == "redrive"
    assert causes_wanted([rec], {rec.ref: effect}) == {("w1", "c-1")}
    # Another reason with a cause is not held back by it.
    assert _decide(dataclasses.replace(rec, letter=dataclasses.replace(letter, reason="commit-failed"))).send


def test_a_stale_letter_is_labelled_stale_not_applied() -> None:
    assert _decide(_rec("stale-version"), applied={("w1", "e-1")}).action == "stale"
