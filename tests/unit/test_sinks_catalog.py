"""NessieCatalog.begin with tables to read: the head and their contents in one round trip (no Nessie)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sinks.catalog import NessieCatalog, ReadOnlyReference
from sinks.nessie import IcebergTable, Reference


class OneCall:
    """A client that answers only the combined contents call, and records what was asked."""

    def __init__(self, ref_type: str = "BRANCH") -> None:
        self.ref_type = ref_type
        self.calls: list[tuple[str, list[tuple[str, ...]]]] = []

    def get_contents_and_reference(
        self, ref: str, keys: list[tuple[str, ...]]
    ) -> tuple[dict[tuple[str, ...], IcebergTable], Reference]:
        self.calls.append((ref, keys))
        return {keys[0]: IcebergTable("file:///m.json", id="c1")}, Reference(ref, self.ref_type, "h1")  # type: ignore[arg-type]


def test_begin_pins_the_hash_the_contents_were_read_at_and_keeps_them(tmp_path: Path) -> None:
    client = OneCall()
    cat = NessieCatalog(client=client, ref="world-a", warehouse=f"file://{tmp_path}")  # type: ignore[arg-type]
    cat.reading([("onto", "entity_events"), ("onto", "entity_edge")])
    assert cat.begin() == "h1" and cat.base_hash == "h1" and cat.read_ref == "world-a@h1"
    cat.prefetch([("onto", "entity_events"), ("onto", "entity_edge")])  # already read: no call
    assert client.calls == [("world-a", [("onto", "entity_events"), ("onto", "entity_edge")])]
    assert cat._content(("onto", "entity_edge")) is None  # absent at that commit, and not asked again
    assert len(client.calls) == 1


def test_begin_with_tables_to_read_refuses_a_tag(tmp_path: Path) -> None:
    cat = NessieCatalog(client=OneCall("TAG"), ref="v1", warehouse=f"file://{tmp_path}")  # type: ignore[arg-type]
    with pytest.raises(ReadOnlyReference):
        cat.reading([("onto", "entity_events")]).begin()
    assert not cat.staging
