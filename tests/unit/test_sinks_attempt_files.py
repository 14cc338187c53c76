"""What one batch's attempts wrote is taken by a later attempt only under the same inputs."""

from __future__ import annotations

from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.metadata import TableMetadata, new_table_metadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER
from pyiceberg.transforms import BucketTransform
from pyiceberg.types import NestedField, StringType

from sinks.attempt_files import AttemptFiles, write_key


def _metadata(**properties: str) -> TableMetadata:
    schema = Schema(NestedField(1, "pk", StringType(), required=False))
    spec = PartitionSpec(PartitionField(1, 1000, BucketTransform(4), "pk_bucket"))
    return new_table_metadata(schema, spec, UNSORTED_SORT_ORDER, "file:///t", properties)


def test_a_later_attempt_with_the_same_key_takes_what_the_first_wrote() -> None:
    files = AttemptFiles()
    writes: list[str] = []

    def write(name: str) -> list[str]:
        writes.append(name)
        return [f"{name}.parquet"]

    assert files.written(("log", 1), lambda: write("a")) == ["a.parquet"]
    assert ("log", 1) in files and ("log", 2) not in files
    assert files.written(("log", 1), lambda: write("b")) == ["a.parquet"]
    assert files.written(("log", 2), lambda: write("c")) == ["c.parquet"]
    assert writes == ["a", "c"] and files.reused == 1


def test_the_write_key_follows_the_schema_the_specs_and_the_write_properties_only() -> None:
    base = _metadata(**{"write.target-file-size-bytes": "1000", "causeway.committed-offsets": "{}"})
    assert write_key(base) == write_key(
        base.model_copy(update={"properties": {**base.properties, "causeway.committed-offsets": "{1}"}})
    )
    assert write_key(base) != write_key(
        base.model_copy(update={"properties": {**base.properties, "write.target-file-size-bytes": "9"}})
    )
    assert write_key(base) != write_key(base.model_copy(update={"current_schema_id": 1}))
    assert write_key(base) != write_key(base.model_copy(update={"default_spec_id": 1}))
    more = [*base.partition_specs, PartitionSpec(spec_id=1)]
    assert write_key(base) != write_key(base.model_copy(update={"partition_specs": more}))


def test_an_attempt_keeps_the_batchs_first_time_only_while_the_head_is_older() -> None:
    # The log is folded in committed_at order: a retry after a rival that landed after the batch
    # began takes a time after the rival's snapshot, not the older first time.
    from datetime import UTC, datetime, timedelta

    from sinks.attempt_files import commit_time

    first = datetime(2026, 12, 2, 7, 0, tzinfo=UTC)
    later = first + timedelta(seconds=5)
    ms = int(first.timestamp() * 1000)
    assert commit_time(first, None, lambda: later) == first
    assert commit_time(first, ms - 1, lambda: later) == first
    assert commit_time(first, ms, lambda: later) == later
    # a clock behind the head's snapshot (another host's) still stamps after it
    assert commit_time(first, ms + 9_000, lambda: later) == datetime.fromtimestamp((ms + 9_001) / 1000, UTC)


def test_the_write_key_names_the_table_itself() -> None:
    # A table dropped and recreated between two attempts must not hand the new one the old files.
    from types import SimpleNamespace

    from sinks.attempt_files import write_key

    def meta(uuid: str, location: str) -> object:
        return SimpleNamespace(
            table_uuid=uuid,
            location=location,
            format_version=2,
            current_schema_id=0,
            default_spec_id=0,
            partition_specs=[],
            properties={},
        )

    assert write_key(meta("a", "s3://w/t")) == write_key(meta("a", "s3://w/t"))
    assert write_key(meta("a", "s3://w/t")) != write_key(meta("b", "s3://w/t"))
    assert write_key(meta("a", "s3://w/t")) != write_key(meta("a", "s3://w/t2"))
