"""The dedupe window's layout (pure): exact encodings, slots, expiry, and what a lookup reads."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.dedupe_window import FAMILIES, SLOTS_PER_WINDOW, Encoded, MarkWindow, decode, encode


def test_uuid_and_cdc_ids_pack_to_16_bytes_and_others_are_kept_whole() -> None:
    u = str(uuid.uuid4())
    assert encode(u) == Encoded("u", uuid.UUID(u).bytes)
    c = "cdc-" + "ab" * 16
    assert encode(c) == Encoded("c", bytes.fromhex("ab" * 16))
    # Not canonical (upper case, no dashes): stored as they are, never rewritten to another id.
    for other in (u.upper(), u.replace("-", ""), "ev-7-123", "cdc-" + "AB" * 16):
        assert encode(other) == Encoded("s", other.encode())


@given(st.one_of(st.uuids().map(str), st.binary(min_size=16, max_size=16).map(lambda b: "cdc-" + b.hex()), st.text()))
def test_every_id_comes_back_from_its_stored_form(event_id: str) -> None:
    assert decode(encode(event_id)) == event_id


@given(
    window=st.integers(SLOTS_PER_WINDOW, 100_000),
    written=st.floats(1e9, 2e9, allow_nan=False),
    later=st.floats(0, 1, allow_nan=False),
)
def test_a_mark_is_read_for_the_whole_window_and_its_key_outlives_it(window: int, written: float, later: float) -> None:
    w = MarkWindow(window, 8)
    slot = w.slot(written)
    asked_at = written + later * window
    assert slot in w.live_slots(asked_at)
    assert w.expire_at(slot) >= written + window  # the key is still there when asked
    assert w.expire_at(slot) <= written + window + w.slot_s  # and gone one slot later at most
    assert len(w.live_slots(asked_at)) <= SLOTS_PER_WINDOW + 1


def test_keys_carry_the_world_as_hash_tag_and_buckets_stay_in_range() -> None:
    w = MarkWindow(3600, 100)
    assert w.key("w-1", 5, "u", 255) == "causeway:marks:{w-1}:5:uff"
    assert {w.bucket(f"e{i}") for i in range(5000)} == set(range(100))
    assert MarkWindow(3600, 1, prefix="bench:x:").key("w", 0, "s", 0) == "bench:x:{w}:0:s0"


def test_memory_formula_and_checks() -> None:
    # 5,000 events/s, a 1-hour window (2 slots of 30 min), 18 bytes a mark: 486 MB.
    assert MarkWindow(3600, 1).bytes_held(5_000, 18) == 5_000 * 5_400 * 18
    with pytest.raises(ValueError):
        MarkWindow(1, 1)
    with pytest.raises(ValueError):
        MarkWindow(3600, 0)


_IDS = st.one_of(
    st.uuids().map(str),
    st.binary(min_size=16, max_size=16).map(lambda b: "cdc-" + b.hex()),
    st.text(min_size=36, max_size=36),
    st.text(),
)


@given(_IDS, st.integers(1, 5000))
def test_place_is_encode_and_bucket_in_one_pass(event_id: str, buckets: int) -> None:
    w = MarkWindow(3600, buckets)
    enc = encode(event_id)
    assert w.place(event_id) == (enc.family, enc.data, w.bucket(event_id))


def test_a_key_is_its_prefix_and_its_buckets_name() -> None:
    w = MarkWindow(3600, 300, prefix="bench:x:")
    names = w.bucket_names()
    assert len(names) == 300
    assert all(w.key_prefix("w-1", 7, f) + names[b] == w.key("w-1", 7, f, b) for f in FAMILIES for b in range(300))


def test_a_batchs_groups_are_what_place_gives_each_id() -> None:
    # ``groups`` inlines ``place``'s plain-text rule for ids that cannot be packed: both must agree.
    w = MarkWindow(3600, 16)
    ids = [str(uuid.uuid4()) for _ in range(40)] + [f"evt-{i}" for i in range(40)] + ["x" * 36, "é" * 36]
    got = {
        (family, bucket, i, d)
        for (family, bucket), (eids, datas) in w.groups(ids)
        for i, d in zip(eids, datas, strict=True)
    }
    assert got == {(*w.place(i)[::2], i, w.place(i)[1]) for i in ids}
    assert sum(len(eids) for _, (eids, _) in w.groups(ids)) == len(ids)
