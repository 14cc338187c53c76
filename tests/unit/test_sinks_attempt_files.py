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
