"""The Nessie-backed pyiceberg catalog against the real Nessie: staging, atomic publish, time travel."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from pyiceberg.exceptions import NoSuchTableError

from sinks.catalog import NessieCatalog, ReadOnlyReference
from sinks.errors import NessieConflict
from sinks.nessie import SyncNessieClient
from tests.integration.commits import empty_root

pytestmark = pytest.mark.integration


SCHEMA = pa.schema([pa.field("x", pa.int64(), nullable=False)])


@pytest.fixture
def branch(client: SyncNessieClient, unique: str) -> str:
    name = f"test-cat-{unique}"
    client.create_branch(name, empty_root(client))
    return name


@pytest.fixture
def catalog(client: SyncNessieClient, branch: str, warehouse: str) -> NessieCatalog:
    cat = NessieCatalog(client=client, ref=branch, warehouse=warehouse)
    cat.create_namespace("onto")
    for name in ("a", "b"):
        cat.create_table(("onto", name), SCHEMA).append(pa.table({"x": [1]}, schema=SCHEMA))
    return cat


def rows(cat: NessieCatalog, name: str) -> list[int]:
    return sorted(cat.load_table(("onto", name)).scan().to_arrow().column("x").to_pylist())


def test_tables_are_plain_pyiceberg_tables(catalog: NessieCatalog) -> None:
    assert set(catalog.list_tables("onto")) == {
        ("onto", "a"),
        ("onto", "b"),
    }
    assert catalog.list_namespaces() == [("onto",)]
    table = catalog.load_table("onto.a")
    assert table.metadata_location.startswith(catalog.warehouse)
    assert rows(catalog, "a") == [1]
    with pytest.raises(NoSuchTableError):
        catalog.load_table("onto.missing")


def test_two_tables_publish_as_one_commit(catalog: NessieCatalog, client: SyncNessieClient, branch: str) -> None:
    before = client.get_reference(branch).hash
    catalog.begin()
    catalog.load_table("onto.a").append(pa.table({"x": [2]}, schema=SCHEMA))
    catalog.load_table("onto.b").append(pa.table({"x": [3]}, schema=SCHEMA))
    # Staged, not visible on the branch yet; visible through the staging catalog.
    other = catalog.at(branch)
    assert rows(other, "a") == [1] and rows(other, "b") == [1]
    assert rows(catalog, "a") == [1, 2]
    published = catalog.publish("two tables", {"causeway.batch_id": "t1"})
    assert set(published.keys) == {("onto", "a"), ("onto", "b")}
    page = next(iter(client.history(branch, max_records=2)))
    assert page.items[0].hash == published.hash and page.items[0].parent_hash == before
    assert page.items[0].properties["causeway.batch_id"] == "t1"
    assert rows(other, "a") == [1, 2] and rows(other, "b") == [1, 3]


def test_failure_between_staging_and_publishing_changes_neither_table(
    catalog: NessieCatalog, client: SyncNessieClient, branch: str
) -> None:
    head = client.get_reference(branch).hash

    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with catalog.transaction("never published"):
            catalog.load_table("onto.a").append(pa.table({"x": [2]}, schema=SCHEMA))
            catalog.load_table("onto.b").append(pa.table({"x": [3]}, schema=SCHEMA))
            raise Boom()
    assert client.get_reference(branch).hash == head
    assert rows(catalog, "a") == [1] and rows(catalog, "b") == [1]
    assert not catalog.staging


def test_conflicting_publish_changes_nothing_and_reload_succeeds(catalog: NessieCatalog, branch: str) -> None:
    catalog.begin()
    catalog.load_table("onto.a").append(pa.table({"x": [2]}, schema=SCHEMA))
    catalog.load_table("onto.b").append(pa.table({"x": [3]}, schema=SCHEMA))
    # A concurrent writer moves table a.
    catalog.at(branch).load_table("onto.a").append(pa.table({"x": [9]}, schema=SCHEMA))
    with pytest.raises(NessieConflict):
        catalog.publish("loses")
    assert rows(catalog, "a") == [1, 9] and rows(catalog, "b") == [1]
    # Reload at the new head and apply again: both land.
    catalog.begin()
    catalog.load_table("onto.a").append(pa.table({"x": [2]}, schema=SCHEMA))
    catalog.load_table("onto.b").append(pa.table({"x": [3]}, schema=SCHEMA))
    catalog.publish("wins")
    assert rows(catalog, "a") == [1, 2, 9] and rows(catalog, "b") == [1, 3]


def test_unrelated_commit_in_between_is_rebased_not_refused(catalog: NessieCatalog, branch: str) -> None:
    catalog.begin()
    catalog.load_table("onto.a").append(pa.table({"x": [2]}, schema=SCHEMA))
    catalog.at(branch).load_table("onto.b").append(pa.table({"x": [5]}, schema=SCHEMA))
    catalog.publish("rebased")
    assert rows(catalog, "a") == [1, 2] and rows(catalog, "b") == [1, 5]


def test_read_at_commit_hash_and_as_of_timestamp(catalog: NessieCatalog, client: SyncNessieClient, branch: str) -> None:
    first = client.get_reference(branch).hash
    time.sleep(0.05)
    between_ms = int(time.time() * 1000)
    time.sleep(0.05)
    catalog.load_table("onto.a").append(pa.table({"x": [2]}, schema=SCHEMA))
    assert rows(catalog, "a") == [1, 2]
    at_hash = catalog.at(f"{branch}@{first}")
    assert at_hash.read_only and rows(at_hash, "a") == [1]
    as_of = catalog.as_of(between_ms)
    assert as_of.head() == first and rows(as_of, "a") == [1]
    # The server-side relative form works too.
    assert rows(catalog.at(f"{branch}@*{between_ms}"), "a") == [1]
    with pytest.raises(ReadOnlyReference):
        at_hash.load_table("onto.a").append(pa.table({"x": [3]}, schema=SCHEMA))


def test_tag_is_read_only(catalog: NessieCatalog, client: SyncNessieClient, branch: str, unique: str) -> None:
    tag = f"test-tag-{unique}"
    client.create_tag(tag, client.get_reference(branch))
    try:
        tagged = catalog.at(tag)
        assert tagged.read_only and rows(tagged, "a") == [1]
        with pytest.raises(ReadOnlyReference):
            tagged.begin()
    finally:
        client.delete_reference(tag, client.get_reference(tag).hash, type="TAG")


def test_fork_write_and_source_is_unchanged(
    catalog: NessieCatalog, client: SyncNessieClient, branch: str, unique: str
) -> None:
    fork = f"test-fork-{unique}"
    client.create_branch(fork, client.get_reference(branch))
    forked = catalog.at(fork)
    with forked.transaction("write on the fork"):
        forked.load_table("onto.a").append(pa.table({"x": [7]}, schema=SCHEMA))
        forked.create_table(("onto", "c"), SCHEMA)
    assert rows(forked, "a") == [1, 7] and ("onto", "c") in forked.list_tables("onto")
    assert rows(catalog, "a") == [1] and ("onto", "c") not in catalog.list_tables("onto")


def test_first_commit_on_an_empty_branch_creates_namespace_and_tables_atomically(
    client: SyncNessieClient, unique: str, warehouse: str
) -> None:
    name = f"test-empty-{unique}"
    client.create_branch(name, empty_root(client))
    cat = NessieCatalog(client=client, ref=name, warehouse=warehouse)
    with cat.transaction("bootstrap"):
        cat.create_table(("ns1", "t1"), SCHEMA).append(pa.table({"x": [1]}, schema=SCHEMA))
        cat.create_table(("ns1", "t2"), SCHEMA)
    assert cat.namespace_exists("ns1")
    assert set(cat.list_tables("ns1")) == {("ns1", "t1"), ("ns1", "t2")}
    assert cat.load_table("ns1.t1").scan().to_arrow().num_rows == 1
