"""Per-file key filters (pure): no false negatives, few false positives, also within one bucket."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st
from pyiceberg.transforms import BucketTransform
from pyiceberg.typedef import Record
from pyiceberg.types import StringType

from sinks.keyfilter import KeyFilter, Probe
from sinks.layout import key_filter, parse_spec, partition_spec
from sinks.tables import COMMON

_keys = st.lists(st.text(min_size=0, max_size=12), min_size=1, max_size=300, unique=True)


@settings(max_examples=200, deadline=None)
@given(held=_keys, extra=st.lists(st.text(max_size=12), max_size=50), pick=st.data())
def test_a_filter_holds_every_key_of_its_file(held: list[str], extra: list[str], pick: st.DataObject) -> None:
    # A "no" for a key the file holds would leave its row out of the index: a second live row.
    kf = KeyFilter.build(pa.array(held, pa.string()))
    some = pick.draw(st.lists(st.sampled_from(held), min_size=1, max_size=20))
    assert kf.may_hold(Probe.of(pa.array(some + extra, pa.string())))
    for key in some:
        assert kf.may_hold(Probe.of(pa.array([key], pa.string())))


def test_a_filter_holds_keys_of_a_chunked_column_with_nulls() -> None:
    column = pa.chunked_array([pa.array(["a", None]), pa.array(["b"])])
    kf = KeyFilter.build(column)
    assert kf.may_hold(Probe.of(pa.array(["zz", "b"])))
    assert KeyFilter.build(pa.array(["c"], pa.large_string())).may_hold(Probe.of(pa.array(["c"])))
    assert not kf.may_hold(Probe.of(pa.array([], pa.string())))


def _false_positive_rate(held: list[str], absent: list[str]) -> float:
    kf = KeyFilter.build(pa.array(held))
    probe = Probe.of(pa.array(absent))
    slots, patterns = probe.at(len(kf.words))
    found = pc.equal(pc.bit_wise_and(kf.words.take(slots), patterns), patterns)
    return float(pc.sum(found.cast(pa.int64())).as_py()) / len(absent)


def test_false_positives_are_rare_also_for_keys_of_one_bucket() -> None:
    # A file holds the keys of one (type, bucket) partition and is probed with the batch's keys of
    # that partition: a filter hashing like Iceberg's bucket crowded them into a quarter of its
    # words (~1 % false positives with 4 buckets, most files read for nothing).
    bucket = BucketTransform(4).transform(StringType())
    held = [pk for pk in (f"obj-{i}" for i in range(40_000)) if bucket(pk) == 1]
    absent = [pk for pk in (f"obj-{i}" for i in range(10_000_000, 10_200_000)) if bucket(pk) == 1]
    assert _false_positive_rate(held, absent) < 1e-3
    assert _false_positive_rate(held[:250], absent) < 2e-3  # a flush's small file


def test_a_filter_costs_a_few_bytes_a_key() -> None:
    for n in (1, 250, 10_000):
        kf = KeyFilter.build(pa.array([f"k{i}" for i in range(n)]))
        assert kf.nbytes <= max(8, 10 * n)


def test_key_scan_names_the_pks_that_may_lie_in_a_partition() -> None:
    spec = partition_spec(parse_spec("identity(object_type_id), bucket(4, object_pk)"), COMMON.schema)
    bucket = BucketTransform(4).transform(StringType())
    keys = [("person", f"p-{i}") for i in range(40)] + [("place", f"q-{i}") for i in range(10)] + [("place", "p-1")]
    scan = key_filter("object_type_id", "object_pk", keys)
    assert list(scan.pks()) == sorted({pk for _, pk in keys})

    def pks_in(partition: Record, on: object) -> list[str]:
        return [scan.pks()[i] for i in scan.pk_positions_in(partition, on, COMMON.schema)]

    for typ in ("person", "place", "thing"):
        for b in range(4):
            assert pks_in(Record(typ, b), spec) == sorted(pk for t, pk in keys if t == typ and bucket(pk) == b)
    by_type = partition_spec(parse_spec("identity(object_type_id)"), COMMON.schema)
    assert pks_in(Record("place"), by_type) == sorted(pk for t, pk in keys if t == "place")
    by_bucket = partition_spec(parse_spec("bucket(4, object_pk)"), COMMON.schema)
    assert pks_in(Record(2), by_bucket) == sorted({pk for _, pk in keys if bucket(pk) == 2})
    assert pks_in(Record(), partition_spec((), COMMON.schema)) == list(scan.pks())


def test_a_subset_of_a_probe_probes_like_a_probe_of_its_keys() -> None:
    pks = [f"k{i}" for i in range(100)]
    kf = KeyFilter.build(pa.array(pks[40:41]))
    every = Probe.of(pa.array(pks))
    assert kf.may_hold(every.subset(pa.array([3, 40], pa.int64())))
    assert not kf.may_hold(every.subset(pa.array([0, 1, 2], pa.int64())))
