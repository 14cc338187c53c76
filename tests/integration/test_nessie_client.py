"""The Nessie REST v2 client against the real Nessie server (scripts/services.sh start nessie)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from sinks.errors import (
    NessieBadRequest,
    NessieConflict,
    NessieError,
    NessieNotFound,
    NessieReferenceAlreadyExists,
)
from sinks.nessie import (
    IcebergTable,
    Namespace,
    NessieClient,
    Operation,
    Reference,
    SyncNessieClient,
)
from streams.settings import Settings

pytestmark = pytest.mark.integration

NS = ("ns",)


def _loc(name: str, version: int = 0) -> str:
    return f"file:///tmp/causeway-test/{name}/metadata/{version:05d}.metadata.json"


@pytest.fixture
async def nessie(settings: Settings, nessie_url: str, unique: str) -> AsyncIterator[NessieClient]:
    """A client; afterwards every reference whose name holds this test's unique suffix is deleted."""
    async with NessieClient.from_settings(settings) as client:
        yield client
        for ref in await client.list_references():
            if unique in ref.name:
                await client.delete_reference(ref.name, ref.hash, ref.type)


async def _empty_root(nessie: NessieClient) -> Reference:
    """Nessie's empty root commit: branches made from it see nothing of what main holds."""
    return Reference("main", "BRANCH", (await nessie.config()).no_ancestor_hash)


@pytest.fixture
async def base(nessie: NessieClient, unique: str) -> Reference:
    """A fresh branch off main holding namespace ``ns``.

    Its own first commit gives forks a common ancestor: an empty main has none to merge over.
    """
    main = await _empty_root(nessie)
    branch = await nessie.create_branch(f"test-{unique}", main)
    result = await nessie.commit(branch.name, branch.hash, [Operation.put_namespace(NS)], "create ns")
    return Reference(branch.name, "BRANCH", result.hash)


async def _fork(nessie: NessieClient, base: Reference, name: str) -> Reference:
    return await nessie.create_branch(f"{base.name}-{name}", base)


async def _add_table(nessie: NessieClient, branch: Reference, table: str) -> tuple[str, str]:
    """Commit a new table on ``branch``; returns (new head, content id)."""
    key = (*NS, table)
    result = await nessie.commit(branch.name, branch.hash, [Operation.put_table(key, _loc(table))], f"add {table}")
    return result.hash, result.added_contents[key]


async def test_config(nessie: NessieClient) -> None:
    config = await nessie.config()
    assert config.default_branch == "main"
    assert config.api_version == 2 and config.spec_version.startswith("2.")
    assert len(config.no_ancestor_hash) == 64


async def test_branch_create_get_list_delete(nessie: NessieClient, unique: str) -> None:
    main = await _empty_root(nessie)
    assert main.type == "BRANCH"
    created = await nessie.create_branch(f"b-{unique}", main)
    assert created == Reference(f"b-{unique}", "BRANCH", main.hash)
    assert await nessie.get_reference(created.name) == created
    assert created in await nessie.list_references()
    with pytest.raises(NessieReferenceAlreadyExists):
        await nessie.create_branch(created.name, main)
    deleted = await nessie.delete_reference(created.name, created.hash)
    assert deleted == created
    with pytest.raises(NessieNotFound):
        await nessie.get_reference(created.name)


async def test_branch_name_with_slash_travels_encoded(nessie: NessieClient, unique: str) -> None:
    main = await _empty_root(nessie)
    created = await nessie.create_branch(f"feature/{unique}", main)
    assert (await nessie.get_reference(created.name)).name == f"feature/{unique}"
    assert await nessie.get_entries(created.name) == []


async def test_commit_namespace_and_table_then_read_back(nessie: NessieClient, unique: str) -> None:
    main = await _empty_root(nessie)
    branch = await nessie.create_branch(f"c-{unique}", main)
    table_key = (*NS, "entity_common")
    ops = [
        Operation.put_namespace(NS),
        Operation.put_table(table_key, _loc("ec"), snapshot_id=123, schema_id=1, spec_id=2, sort_order_id=3),
    ]
    props = {"world": "w1", "batch_id": f"batch-{unique}", "event_count": "2"}
    result = await nessie.commit(branch.name, branch.hash, ops, "first batch", "causeway-test", props)
    assert set(result.added_contents) == {NS, table_key}
    table_id = result.added_contents[table_key]
    expected = IcebergTable(_loc("ec"), 123, 1, 2, 3, id=table_id)

    [entry] = [e async for e in nessie.history_entries(branch.name)][:1]
    assert (entry.hash, entry.message, entry.author) == (result.hash, "first batch", "causeway-test")
    assert entry.properties == props
    assert entry.parent_hash == branch.hash and entry.operations is None
    assert abs(entry.commit_time.timestamp() - time.time()) < 60

    [full] = [e async for e in nessie.history_entries(branch.name, fetch_all=True, max_records=1)][:1]
    assert full.operations is not None
    assert {op.key: op.content for op in full.operations} == {
        NS: Namespace(NS, id=result.added_contents[NS]),
        table_key: expected,
    }

    entries = await nessie.get_entries(branch.name, content=True)
    assert {e.key: (e.type, e.content) for e in entries} == {
        NS: ("NAMESPACE", Namespace(NS, id=result.added_contents[NS])),
        table_key: ("ICEBERG_TABLE", expected),
    }
    assert all(e.content is None for e in await nessie.get_entries(branch.name))
    assert [e.key for e in await nessie.get_entries(branch.name, prefix=NS)] == [NS, table_key]
    tables = await nessie.get_entries(branch.name, filter="entry.contentType == 'ICEBERG_TABLE'")
    assert [e.key for e in tables] == [table_key]

    contents = await nessie.get_contents(branch.name, [table_key, (*NS, "missing")])
    assert contents == {table_key: expected}
    # Reads pinned at the parent commit do not see the new table.
    assert await nessie.get_contents(f"{branch.name}@{branch.hash}", [table_key]) == {}


async def test_update_and_delete_table(nessie: NessieClient, base: Reference) -> None:
    key = (*NS, "t")
    head, table_id = await _add_table(nessie, base, "t")
    update = Operation.put_table(key, _loc("t", 1), snapshot_id=2, content_id=table_id)
    head = (await nessie.commit(base.name, head, [update], "update t")).hash
    assert (await nessie.get_contents(base.name, [key]))[key] == IcebergTable(_loc("t", 1), 2, id=table_id)
    await nessie.commit(base.name, head, [Operation.delete(key)], "drop t")
    assert await nessie.get_contents(base.name, [key]) == {}


async def test_commit_conflict_carries_conflict_list(nessie: NessieClient, base: Reference) -> None:
    key = (*NS, "t")
    head, table_id = await _add_table(nessie, base, "t")
    first = Operation.put_table(key, _loc("t", 1), snapshot_id=1, content_id=table_id)
    second = Operation.put_table(key, _loc("t", 2), snapshot_id=2, content_id=table_id)
    await nessie.commit(base.name, head, [first], "writer 1")
    with pytest.raises(NessieConflict) as caught:
        await nessie.commit(base.name, head, [second], "writer 2")
    assert caught.value.status == 409 and caught.value.error_code == "REFERENCE_CONFLICT"
    [conflict] = caught.value.conflicts
    assert (conflict.conflict_type, conflict.key) == ("VALUE_DIFFERS", key)


async def test_stale_expected_hash_rebases_when_keys_are_disjoint(nessie: NessieClient, base: Reference) -> None:
    await _add_table(nessie, base, "a")
    # base.hash is now behind the head, but table b was not touched since: Nessie rebases.
    head, _ = await _add_table(nessie, base, "b")
    assert (await nessie.get_reference(base.name)).hash == head
    assert {e.key for e in await nessie.get_entries(base.name)} == {NS, (*NS, "a"), (*NS, "b")}


async def test_commit_errors_map_to_types(nessie: NessieClient, base: Reference, unique: str) -> None:
    key = (*NS, "t")
    head, _ = await _add_table(nessie, base, "t")
    with pytest.raises(NessieBadRequest, match="no content ID"):
        await nessie.commit(base.name, head, [Operation.put_table(key, _loc("t", 1))], "update without id")
    with pytest.raises(NessieConflict) as caught:
        await nessie.commit(base.name, head, [Operation.put_table(("nope", "t"), _loc("x"))], "no namespace")
    assert [c.conflict_type for c in caught.value.conflicts] == ["NAMESPACE_ABSENT"]
    with pytest.raises(NessieConflict) as caught:
        await nessie.commit(base.name, base.hash, [Operation.put_table(key, _loc("t", 9))], "new key, exists")
    assert [c.conflict_type for c in caught.value.conflicts] == ["KEY_EXISTS"]
    with pytest.raises(NessieNotFound) as not_found:
        await nessie.commit(f"missing-{unique}", head, [Operation.put_namespace(("x",))], "no branch")
    assert not_found.value.error_code == "REFERENCE_NOT_FOUND"


async def test_history_paging_and_cel_filters(nessie: NessieClient, base: Reference) -> None:
    head = base.hash
    for i in range(3):
        op = Operation.put_namespace((f"n{i}",))
        head = (await nessie.commit(base.name, head, [op], f"commit {i}", properties={"batch": f"b{i}"})).hash

    pages = [page async for page in nessie.history(base.name, max_records=1)]
    assert [len(p) for p in pages] == [1] * 4  # three commits and the one that created ns
    assert [p.items[0].message for p in pages] == ["commit 2", "commit 1", "commit 0", "create ns"]
    assert all(p.has_more for p in pages[:-1]) and not pages[-1].has_more
    assert [e.message async for e in nessie.history_entries(base.name, max_records=1)] == [
        p.items[0].message for p in pages
    ]

    by_batch = "'batch' in commit.properties && commit.properties['batch'] == 'b1'"
    assert [e.message async for e in nessie.history_entries(base.name, filter=by_batch)] == ["commit 1"]
    # commit_time keeps microseconds; Nessie keeps nanoseconds, so step past commit 0 by 1 µs.
    since = (pages[2].items[0].commit_time + timedelta(microseconds=1)).isoformat().replace("+00:00", "Z")
    recent = f"timestamp(commit.commitTime) > timestamp('{since}')"
    assert [e.message async for e in nessie.history_entries(base.name, filter=recent)] == [
        "commit 2",
        "commit 1",
    ]
    with pytest.raises(NessieBadRequest):
        [e async for e in nessie.history_entries(base.name, filter="commit.message ==")]


async def test_time_travel_references(nessie: NessieClient, base: Reference) -> None:
    first, _ = await _add_table(nessie, base, "a")
    await asyncio.sleep(0.01)
    between_ms = int(time.time() * 1000)
    await asyncio.sleep(0.01)
    await _add_table(nessie, Reference(base.name, "BRANCH", first), "b")

    def keys(entries: list) -> set:
        return {e.key[-1] for e in entries if len(e.key) == 2}

    assert keys(await nessie.get_entries(base.name)) == {"a", "b"}
    assert keys(await nessie.get_entries(f"{base.name}@{first}")) == {"a"}
    assert keys(await nessie.get_entries(f"{base.name}~1")) == {"a"}
    assert keys(await nessie.get_entries(f"{base.name}*{between_ms}")) == {"a"}
    iso = datetime.fromtimestamp(between_ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert keys(await nessie.get_entries(f"{base.name}*{iso}")) == {"a"}
    with pytest.raises(NessieBadRequest):  # 0.99 wants the fractional seconds
        await nessie.get_entries(f"{base.name}*{iso[:19]}Z")


async def test_diff_between_branches(nessie: NessieClient, base: Reference) -> None:
    fork = await _fork(nessie, base, "diff")
    await _add_table(nessie, fork, "only_on_fork")
    [diff] = await nessie.diff(base.name, fork.name)
    assert diff.key == (*NS, "only_on_fork") and diff.from_content is None
    assert isinstance(diff.to_content, IcebergTable) and diff.to_content.metadata_location == _loc("only_on_fork")
    assert await nessie.diff(base.name, base.name) == []


async def test_merge_dry_run_then_real(nessie: NessieClient, base: Reference) -> None:
    fork = await _fork(nessie, base, "merge")
    fork_head, table_id = await _add_table(nessie, fork, "t")

    dry = await nessie.merge(base.name, base.hash, fork.name, fork_head, dry_run=True, message="try")
    assert dry.was_successful and not dry.was_applied and dry.resultant_target_hash is None
    assert [d.key for d in dry.details] == [(*NS, "t")]
    assert (await nessie.get_reference(base.name)).hash == base.hash, "a dry run must not move the branch"

    real = await nessie.merge(base.name, base.hash, fork.name, fork_head, message="merge fork")
    assert real.was_applied and real.was_successful and real.common_ancestor == base.hash
    head = await nessie.get_reference(base.name)
    assert head.hash == real.resultant_target_hash
    assert (await nessie.get_contents(base.name, [(*NS, "t")]))[(*NS, "t")].id == table_id
    assert [e.message async for e in nessie.history_entries(base.name, max_records=1)][0] == "merge fork"


async def test_merge_conflict_as_error_as_result_and_forced(nessie: NessieClient, base: Reference) -> None:
    key = (*NS, "t")
    head, table_id = await _add_table(nessie, base, "t")
    fork = await nessie.create_branch(f"{base.name}-conflict", Reference(base.name, "BRANCH", head))
    head = (
        await nessie.commit(base.name, head, [Operation.put_table(key, _loc("t", 1), content_id=table_id)], "b")
    ).hash
    fork_head = (
        await nessie.commit(fork.name, fork.hash, [Operation.put_table(key, _loc("t", 2), content_id=table_id)], "f")
    ).hash

    result = await nessie.merge(base.name, head, fork.name, fork_head, dry_run=True, return_conflict_as_result=True)
    assert not result.was_successful and not result.was_applied
    assert [(c.conflict_type, c.key) for c in result.conflicts] == [("VALUE_DIFFERS", key)]
    with pytest.raises(NessieConflict) as caught:
        await nessie.merge(base.name, head, fork.name, fork_head)
    assert [c.key for c in caught.value.conflicts] == [key]
    assert (await nessie.get_reference(base.name)).hash == head

    forced = await nessie.merge(base.name, head, fork.name, fork_head, default_mode="FORCE")
    assert forced.was_applied and [d.merge_behavior for d in forced.details] == ["FORCE"]
    forced_table = (await nessie.get_contents(base.name, [key]))[key]
    assert isinstance(forced_table, IcebergTable) and forced_table.metadata_location == _loc("t", 2)


async def test_transplant(nessie: NessieClient, base: Reference) -> None:
    fork = await _fork(nessie, base, "tp")
    first, _ = await _add_table(nessie, fork, "a")
    second, _ = await _add_table(nessie, Reference(fork.name, "BRANCH", first), "b")
    result = await nessie.transplant(base.name, base.hash, fork.name, [second], message="pick b")
    assert result.was_applied and result.was_successful
    assert {e.key for e in await nessie.get_entries(base.name)} == {NS, (*NS, "b")}
    assert [e.message async for e in nessie.history_entries(base.name, max_records=1)][0] == "pick b"


async def test_tag_create_assign_delete(nessie: NessieClient, base: Reference, unique: str) -> None:
    tag = await nessie.create_tag(f"release-{unique}", base)
    assert tag == Reference(f"release-{unique}", "TAG", base.hash)
    assert await nessie.get_reference(tag.name) == tag
    head, _ = await _add_table(nessie, base, "t")
    moved = await nessie.assign_reference(tag.name, tag.hash, Reference(base.name, "BRANCH", head), "TAG")
    assert moved == Reference(tag.name, "TAG", head)
    with pytest.raises(NessieConflict) as caught:
        await nessie.delete_reference(tag.name, tag.hash, "TAG")
    assert [c.conflict_type for c in caught.value.conflicts] == ["UNEXPECTED_HASH"]
    with pytest.raises(NessieBadRequest):
        await nessie.delete_reference(tag.name, head, "BRANCH")
    await nessie.delete_reference(tag.name, head, "TAG")
    with pytest.raises(NessieNotFound):
        await nessie.get_reference(tag.name)


async def test_assign_branch_rolls_back(nessie: NessieClient, base: Reference) -> None:
    head, _ = await _add_table(nessie, base, "t")
    rolled = await nessie.assign_reference(base.name, head, base)
    assert rolled == base
    assert await nessie.get_contents(base.name, [(*NS, "t")]) == {}
    with pytest.raises(NessieConflict):
        await nessie.assign_reference(base.name, head, base)


async def test_not_found_and_bad_request_mapping(nessie: NessieClient, base: Reference, unique: str) -> None:
    with pytest.raises(NessieNotFound) as caught:
        await nessie.get_reference(f"missing-{unique}")
    assert caught.value.status == 404 and "not found" in str(caught.value)
    with pytest.raises(NessieNotFound):
        await nessie.create_branch(f"x-{unique}", Reference("main", "BRANCH", "deadbeef" * 8))
    with pytest.raises(NessieNotFound):
        await nessie.get_entries(f"missing-{unique}")
    with pytest.raises(NessieBadRequest):
        await nessie.create_branch(f"bad..{unique}", base)
    with pytest.raises(NessieBadRequest):
        await nessie.get_reference(f"{base.name}@{base.hash}")
    with pytest.raises(ValueError):
        await nessie.get_contents(base.name, [])
    assert issubclass(NessieNotFound, NessieError) and issubclass(NessieBadRequest, NessieError)


def test_sync_facade(settings: Settings, nessie_url: str, unique: str) -> None:
    with SyncNessieClient.from_settings(settings) as nessie:
        main = Reference("main", "BRANCH", nessie.config().no_ancestor_hash)
        branch = nessie.create_branch(f"sync-{unique}", main)
        try:
            key = (*NS, "t")
            ops = [Operation.put_namespace(NS), Operation.put_table(key, _loc("t"))]
            result = nessie.commit(branch.name, branch.hash, ops, "sync commit", properties={"k": "v"})
            [entry] = list(nessie.history_entries(branch.name, max_records=1))[:1]
            assert (entry.hash, entry.properties) == (result.hash, {"k": "v"})
            assert [len(p) for p in nessie.history(branch.name, max_records=1)] == [1]
            assert nessie.get_contents(branch.name, [key])[key].id == result.added_contents[key]
            assert {e.key for e in nessie.get_entries(branch.name)} == {NS, key}
            assert [d.key for d in nessie.diff(main.pinned, branch.name)] == [NS, key]
            with pytest.raises(NessieConflict):
                nessie.delete_reference(branch.name, branch.hash)
        finally:
            nessie.delete_reference(branch.name, nessie.get_reference(branch.name).hash)
