"""Manifests as :class:`sinks.rowdelta.RowDelta` writes them: pyiceberg's v2 manifest writer with its
Avro set-up kept per (schema, spec) and all of a manifest's entries in one Avro block.

The write-side twin of :mod:`sinks.manifest_cache`. pyiceberg's ``ManifestWriter`` builds the entry
schema for the table's partition type twice, resolves an Avro writer tree and converts the schema
to Avro JSON for every manifest it opens (~3 ms of CPU each in a profile of ``bench.commit_cpu
--events 200``, 4-5 manifests a commit), and writes every entry as its own compressed Avro block
(a sync marker and a deflate call per entry). The file is the same Avro manifest (same header
metadata and schema, readable by pyiceberg and Java Iceberg); only the block boundaries differ,
which Avro leaves to the writer. The entries written are kept (:attr:`ManifestWriter.entries`) so
the snapshot producer can hand them to the manifest cache instead of the next flush reading them.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from pydantic_core import to_json
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.avro.file import (
    _SCHEMA_KEY,
    AVRO_CODEC_KEY,
    CODEC_MAPPING_ICEBERG_TO_AVRO,
    MAGIC,
    META_SCHEMA,
    SYNC_SIZE,
    AvroFileHeader,
    AvroOutputFile,
)
from pyiceberg.avro.resolver import construct_writer, resolve_writer
from pyiceberg.avro.writer import (
    BinaryWriter,
    DefaultWriter,
    IntegerWriter,
    ListWriter,
    MapWriter,
    OptionWriter,
    StructWriter,
    Writer,
)
from pyiceberg.io import OutputFile
from pyiceberg.manifest import (
    DEFAULT_READ_VERSION,
    MANIFEST_LIST_FILE_SCHEMAS,
    UNASSIGNED_SEQ,
    ManifestContent,
    ManifestEntry,
    ManifestFile,
    ManifestListWriterV2,
    ManifestWriterV2,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.typedef import Record
from pyiceberg.types import StructType
from pyiceberg.utils.schema_conversion import AvroSchemaConversion

#: (file schema, writer tree, schema JSON, the header without its sync marker when it is fixed).
_Setup = tuple[Schema, Writer, str, bytes | None]
_SETUPS: dict[tuple[tuple[str, str], ...], _Setup] = {}
_LOCK = threading.Lock()
#: Distinct (table schema, spec, content) set-ups kept; a worker sees a few per table and schema version.
MAX_SETUPS = 256
_META_WRITER = construct_writer(META_SCHEMA)


@dataclass(frozen=True)
class _SpecFacts:
    """What a manifest's header and summaries derive from its table schema and spec alone."""

    schema: Schema  # held, so the ids keying ``_FACTS`` are not reused while the entry lives
    spec: PartitionSpec
    schema_json: str
    spec_json: str
    #: A partition's path (``type=person/bucket=3``) by its values: the key of a snapshot summary's
    #: per-partition counts (``sinks.rowdelta``); a table has a few partitions, bounded by ``MAX_PATHS``.
    paths: dict[tuple[Any, ...], str] = field(default_factory=dict)
    #: Derived once, when first asked for (``partition_type``).
    kept: dict[str, Any] = field(default_factory=dict)

    def partition_type(self) -> StructType:
        """The spec's partition type over the schema (pydantic models, ~26-36 µs to build): what
        each manifest's partition summaries are typed by."""
        found = self.kept.get("partition_type")
        if found is None:
            found = self.kept["partition_type"] = self.spec.partition_type(self.schema)
        return found

    def path(self, partition: Record) -> str:
        values: tuple[Any, ...] = tuple(partition)  # type: ignore[arg-type]  # a Record iterates its values
        path = self.paths.get(values)
        if path is None:
            if len(self.paths) >= MAX_PATHS:
                self.paths.clear()
            path = self.paths[values] = self.spec.partition_to_path(partition, self.schema)
        return path


#: Facts per (schema, spec) object pair. A table's schema and spec objects live as long as its kept
#: metadata (``sinks.table_metadata.CACHE`` hands the written metadata to the next commit, and its
#: updates never copy them), so a world's every commit finds them here; keyed by identity because
#: equal-looking schemas of different tables must not share a JSON (field ids, docs).
_FACTS: dict[tuple[int, int], _SpecFacts] = {}
#: A worker sees one (schema, spec) pair per table per schema version: ~3 per busy world.
MAX_FACTS = 4096
MAX_PATHS = 1024


def spec_facts(schema: Schema, spec: PartitionSpec) -> _SpecFacts:
    """The schema's and spec's JSON, and the partitions' paths, computed once per object pair
    (pyiceberg serialised the table schema for every manifest's header and derived a partition's
    path in every snapshot's summary)."""
    key = (id(schema), id(spec))
    with _LOCK:
        facts = _FACTS.get(key)
    if facts is not None and facts.schema is schema and facts.spec is spec:
        return facts
    facts = _SpecFacts(
        schema,
        spec,
        schema.model_dump_json(),
        to_json(spec.fields).decode("utf-8"),
    )
    with _LOCK:
        if len(_FACTS) >= MAX_FACTS:
            _FACTS.clear()
        _FACTS[key] = facts
    return facts


def _header_prefix(metadata: dict[str, str], schema_json: str) -> bytes:
    """An Avro file header up to its sync marker: the magic and the metadata map, as pyiceberg's
    ``AvroOutputFile._write_header`` gives them, encoded in one pass (pyiceberg's encoder writes
    every byte of a length as its own write)."""
    codec = metadata[AVRO_CODEC_KEY]
    codec = CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec, codec)
    meta = {**metadata, _SCHEMA_KEY: schema_json, AVRO_CODEC_KEY: codec}
    encoder = BlockEncoder()
    _META_WRITER.write(encoder, AvroFileHeader(MAGIC, meta, bytes(SYNC_SIZE)))
    return bytes(encoder.buffer[:-SYNC_SIZE])


class _OneBlockAvroFile(AvroOutputFile[Any]):
    """An ``AvroOutputFile`` that takes its writer tree and schema JSON ready-made and writes the
    records it is given as one block when it is closed: the header and the block one stream write
    each."""

    def __init__(self, output_file: OutputFile, setup: _Setup, metadata: dict[str, str], schema_name: str) -> None:
        self.output_file = output_file
        self.file_schema, self.writer, self._schema_json, self._header = setup
        self.schema_name = schema_name
        self.sync_bytes = os.urandom(SYNC_SIZE)
        self.metadata = metadata
        self.pending: list[Any] = []

    def _write_header(self) -> None:
        header = self._header if self._header is not None else _header_prefix(self.metadata, self._schema_json)
        self.encoder.write(header + self.sync_bytes)

    def write_block(self, objects: list[Any]) -> None:
        self.pending.extend(objects)

    def __exit__(
        self, exctype: type[BaseException] | None, excinst: BaseException | None, exctb: TracebackType | None
    ) -> None:
        try:
            if exctype is None and self.pending:
                self._write_pending()
        finally:
            super().__exit__(exctype, excinst, exctb)

    def _write_pending(self) -> None:
        """pyiceberg's ``AvroOutputFile.write_block``, the records encoded by a :class:`BlockEncoder`."""
        encoder = BlockEncoder()
        for record in self.pending:
            self.writer.write(encoder, record)
        content = bytes(encoder.buffer)
        block = BlockEncoder()
        block.write_int(len(self.pending))
        if codec := self.compression_codec():
            compressed, length = codec.compress(content)
            block.write_int(length)
            block.write(compressed)
        else:
            block.write_int(len(content))
            block.write(content)
        block.write(self.sync_bytes)
        self.encoder.write(bytes(block.buffer))


@dataclass(frozen=True)
class _IntMapWriter(Writer):
    """pyiceberg's ``MapWriter`` of an int-keyed map whose values one encoder call writes (the
    column metrics maps of a manifest entry: sizes and counts as longs, bounds as bytes), without
    a writer call per key and per value."""

    binary_values: bool

    def write(self, encoder: BinaryEncoder, val: dict[int, Any]) -> None:
        if type(encoder) is BlockEncoder:
            self._into(encoder.buffer, val)
            return
        write_int = encoder.write_int
        write_value = encoder.write_bytes if self.binary_values else write_int
        write_int(len(val))
        for k, v in val.items():
            write_int(k)
            write_value(v)
        if val:
            write_int(0)

    def _into(self, buffer: bytearray, val: dict[int, Any]) -> None:
        # The same bytes, each long through the table of small ones: a new data file's entry
        # writes ~130 longs in these maps (a key and a size, count or length per column), most of
        # them field ids, counts and lengths under 8,192 (two bytes at most).
        small, n = _SMALL_LONGS, len(_SMALL_LONGS)
        size = len(val)
        buffer += small[size] if size < n else _long(size)
        binary = self.binary_values
        for k, v in val.items():
            buffer += small[k] if 0 <= k < n else _long(k)
            if binary:
                length = len(v)
                buffer += small[length] if length < n else _long(length)
                buffer += v
            else:
                buffer += small[v] if 0 <= v < n else _long(v)
        if size:
            buffer.append(0)


def _long(integer: int) -> bytes:
    """An Avro long: zig-zag, then a varint of 7 bits a byte, low bits first (pyiceberg's encoder)."""
    datum = (integer << 1) ^ (integer >> 63)
    out = bytearray()
    while datum & ~0x7F:
        out.append((datum & 0x7F) | 0x80)
        datum >>= 7
    out.append(datum)
    return bytes(out)


#: The Avro longs 0 to 8,191, encoded (one or two bytes each; ~0.3 MiB for the process).
_SMALL_LONGS: tuple[bytes, ...] = tuple(_long(i) for i in range(8192))


#: Where a data file or a manifest-list entry keeps its encoded Avro record (an attribute of the object).
_KEPT = "_causeway_avro"


def _unchanging(val: Any) -> None:
    return None


def _sequence_numbers(val: ManifestFile) -> tuple[int, int]:
    return val.sequence_number, val.min_sequence_number


@dataclass(frozen=True)
class _KeptWriter(Writer):
    """A record encoded once and its bytes kept on the object written, reused while it is unchanged.

    A manifest entry's ``data_file`` struct never changes (status, snapshot id and sequence numbers
    are the entry's, outside it), but a commit that removes a file rewrites every entry of the
    manifests holding it, and on the partitioned layout each flush removes files in every
    (type, bucket) it touches: a small commit re-encoded ~130 entries of up to 40 metrics
    values each (``bench.commit_cpu --object-types 3``, 4 buckets), most of writing its
    manifests. Likewise a manifest list lists every manifest of the table, and all but the one to
    three a commit writes are the previous list's, field for field.

    The bytes are kept on the object, so they live exactly as long as it does (in the manifest
    cache) and need no bound of their own (~0.3-0.7 KiB a data file); they are tagged with the
    writer that made them, since another partition type (spec) or format version encodes
    differently, and with ``stamp(val)``: the fields a writer may still assign after the object was
    first written (a new manifest's sequence numbers, given by the list that first lists it).
    """

    inner: Writer
    stamp: Callable[[Any], object] = _unchanging

    def write(self, encoder: BinaryEncoder, val: Any) -> None:
        kept = vars(val).get(_KEPT)
        stamp = self.stamp(val)
        if kept is not None and kept[0] is self.inner and kept[1] == stamp:
            encoder.write(kept[2])
            return
        if not isinstance(encoder, BlockEncoder):
            self.inner.write(encoder, val)
            return
        start = len(encoder.buffer)
        self.inner.write(encoder, val)
        vars(val)[_KEPT] = (self.inner, stamp, bytes(encoder.buffer[start:]))


def _with_kept_data_files(tree: Writer, file_schema: Schema) -> Writer:
    """``tree`` (a manifest entry's) with its ``data_file`` field written by :class:`_KeptWriter`."""
    assert isinstance(tree, StructWriter)
    names = [f.name for f in file_schema.fields]
    return StructWriter(
        tuple((pos, _KeptWriter(w) if names[i] == "data_file" else w) for i, (pos, w) in enumerate(tree.field_writers))
    )


def _with_int_maps(tree: Writer) -> Writer:
    """``tree`` with every map of int keys to longs or bytes written by :class:`_IntMapWriter`."""
    if isinstance(tree, MapWriter) and type(tree.key_writer) is IntegerWriter:
        if type(tree.value_writer) in (IntegerWriter, BinaryWriter):
            return _IntMapWriter(type(tree.value_writer) is BinaryWriter)
        return MapWriter(tree.key_writer, _with_int_maps(tree.value_writer))
    if isinstance(tree, StructWriter):
        return StructWriter(tuple((pos, _with_int_maps(w)) for pos, w in tree.field_writers))
    if isinstance(tree, OptionWriter):
        return OptionWriter(_with_int_maps(tree.option))
    if isinstance(tree, ListWriter):
        return ListWriter(_with_int_maps(tree.element_writer))
    if isinstance(tree, DefaultWriter):
        return DefaultWriter(_with_int_maps(tree.writer), tree.value)
    return tree


class BlockEncoder(BinaryEncoder):
    """pyiceberg's Avro ``BinaryEncoder`` into a byte buffer, a varint in one pass: pyiceberg's writes
    every byte of a varint as its own ``bytes`` through the stream's ``write``, and a manifest entry
    holds hundreds of them (its column metrics maps): ~4,600 writes a 10-event commit, the largest
    share of writing manifests. The bytes are the same (``tests/unit/test_sinks_manifest_write.py``)."""

    def __init__(self) -> None:
        self.buffer = bytearray()

    def write(self, b: bytes) -> None:
        self.buffer += b

    def write_boolean(self, boolean: bool) -> None:
        self.buffer.append(1 if boolean else 0)

    def write_int(self, integer: int) -> None:
        self.buffer += _SMALL_LONGS[integer] if 0 <= integer < 8192 else _long(integer)

    def write_bytes(self, b: bytes) -> None:
        self.write_int(len(b))
        self.buffer += b

    def write_utf8(self, s: str) -> None:
        self.write_bytes(s.encode())


class ManifestWriter(ManifestWriterV2):
    """A v2 manifest writer of ``content`` (data or deletes) for :class:`sinks.rowdelta.RowDelta`."""

    def __init__(
        self,
        spec: PartitionSpec,
        schema: Schema,
        output_file: OutputFile,
        snapshot_id: int,
        avro_compression: Any,
        content: ManifestContent,
    ) -> None:
        super().__init__(spec, schema, output_file, snapshot_id, avro_compression)
        self._content = content

    def content(self) -> ManifestContent:
        return self._content

    @property
    def _meta(self) -> dict[str, str]:
        # pyiceberg's keys in pyiceberg's order, the JSON kept per (schema, spec) (``spec_facts``).
        facts = spec_facts(self._schema, self._spec)
        return {
            "schema": facts.schema_json,
            "partition-spec": facts.spec_json,
            "partition-spec-id": str(self._spec.spec_id),
            "format-version": str(self.version),
            AVRO_CODEC_KEY: self._compression,
            "content": "deletes" if self._content == ManifestContent.DELETES else "data",
        }

    def new_writer(self) -> AvroOutputFile[ManifestEntry]:
        meta = self._meta
        key = tuple(sorted(meta.items()))  # the table schema's and the spec's JSON: what the set-up derives from
        with _LOCK:
            setup = _SETUPS.get(key)
        if setup is None:
            file_schema = self._with_partition(self.version)
            tree = _with_kept_data_files(
                _with_int_maps(
                    resolve_writer(record_schema=self._with_partition(DEFAULT_READ_VERSION), file_schema=file_schema)
                ),
                file_schema,
            )
            avro = json.dumps(AvroSchemaConversion().iceberg_to_avro(file_schema, schema_name="manifest_entry"))
            setup = (file_schema, tree, avro, _header_prefix(meta, avro))  # the header is the set-up's key
            with _LOCK:
                if len(_SETUPS) >= MAX_SETUPS:
                    _SETUPS.clear()
                _SETUPS[key] = setup
        return _OneBlockAvroFile(self._output_file, setup, meta, "manifest_entry")

    def to_manifest_file(self) -> ManifestFile:
        """pyiceberg's, the partition summaries typed by the partition type kept per (schema, spec)
        (``spec_facts``): pyiceberg built it for every manifest (its ``construct_partition_summaries``
        reads nothing of the spec but ``partition_type``, and ``to_manifest_file`` its id)."""
        spec = self._spec
        self._spec = _TypedSpec(spec.spec_id, spec_facts(self._schema, spec).partition_type())  # type: ignore[assignment]
        try:
            return super().to_manifest_file()
        finally:
            self._spec = spec

    @property
    def entries(self) -> list[ManifestEntry]:
        """The entries written, as written (sequence numbers of added ones not assigned yet)."""
        writer = self._writer
        assert isinstance(writer, _OneBlockAvroFile)
        return list(writer.pending)


@dataclass(frozen=True)
class _TypedSpec:
    """A partition spec as ``ManifestWriter.to_manifest_file`` reads it: its id and its partition type."""

    spec_id: int
    struct: StructType

    def partition_type(self, schema: Schema) -> StructType:
        return self.struct


def _list_setup(version: int) -> _Setup:
    """The manifest list's writer tree and schema JSON: fixed per format version."""
    key = (("manifest-list", str(version)),)
    with _LOCK:
        setup = _SETUPS.get(key)
    if setup is None:
        file_schema = MANIFEST_LIST_FILE_SCHEMAS[version]
        tree = _KeptWriter(
            _with_int_maps(
                resolve_writer(record_schema=MANIFEST_LIST_FILE_SCHEMAS[DEFAULT_READ_VERSION], file_schema=file_schema)
            ),
            _sequence_numbers,
        )
        avro = json.dumps(AvroSchemaConversion().iceberg_to_avro(file_schema, schema_name="manifest_file"))
        setup = (file_schema, tree, avro, None)  # a list's header holds its snapshot's ids
        with _LOCK:
            _SETUPS[key] = setup
    return setup


class ManifestListWriter(ManifestListWriterV2):
    """pyiceberg's v2 manifest list writer with its Avro set-up kept: it resolved a writer tree and
    converted the list schema to Avro JSON for every list (~1.5 ms of CPU each, one list per table
    per commit: 3-4 % of a 10-event commit). The file is the same; its one block as before.

    Each listed manifest is encoded once (:class:`_KeptWriter`): a table's list repeats the
    previous list's manifests, the same objects (the manifest cache's), in every commit.
    """

    def __enter__(self) -> ManifestListWriter:
        self._writer = _OneBlockAvroFile(
            self._output_file, _list_setup(self._format_version), self._meta, "manifest_file"
        )
        self._writer.__enter__()
        return self

    def add_manifests(self, manifest_files: list[ManifestFile]) -> ManifestListWriter:
        super().add_manifests(manifest_files)
        return self

    def prepare_manifest(self, manifest_file: ManifestFile) -> ManifestFile:
        """pyiceberg's, the sequence numbers of a manifest written in this commit assigned on the
        manifest itself rather than on a copy: the object listed is then the one the snapshot
        producer hands to the manifest cache, and carries its kept encoding to the next list.
        (pyiceberg's copy shares the record's values with the original, so its assignment changed
        the original too: the manifests given end up the same as before.)"""
        seq, min_seq = manifest_file.sequence_number, manifest_file.min_sequence_number
        if seq == UNASSIGNED_SEQ or min_seq == UNASSIGNED_SEQ:
            if manifest_file.added_snapshot_id != self._commit_snapshot_id:
                raise ValueError(
                    f"Found unassigned sequence number for a manifest from snapshot: {manifest_file.added_snapshot_id}"
                )
            if seq == UNASSIGNED_SEQ:
                manifest_file.sequence_number = self._sequence_number
            if min_seq == UNASSIGNED_SEQ:
                manifest_file.min_sequence_number = self._sequence_number
        return manifest_file
