"""GC against the real Nessie and a real warehouse: nothing a ref needs is deleted; dry run == real run."""

from __future__ import annotations

import time
from datetime import timedelta

import orjson
import pyarrow.fs as pafs
import pytest
from click.testing import CliRunner

from cli.main import cli
from sinks.committer import BatchCommitter
from sinks.nessie import Reference, SyncNessieClient
from sinks.readback import read_branch
from streams.settings import Settings
from tests.integration import s3_fixtures
from tests.integration import worlds_fixtures as fx
from tests.integration.test_committer import obj
from tests.integration.worlds_fixtures import WrittenWorld
from worlds.api import Worlds
from worlds.gc_run import GcOutcome, list_files, run_gc

pytestmark = pytest.mark.integration
s3_endpoint = s3_fixtures.s3_endpoint
world_settings, wclient, api = fx.world_settings, fx.wclient, fx.api


@pytest.fixture
def gc_settings(world_settings: Settings) -> Settings:
    # Expire snapshots often so that superseded manifests and files become garbage quickly.
    return world_settings.replace(snapshot_expire_every=2)


def _full_read(settings: Settings, ref: str) -> tuple:
    s = read_branch(settings, ref)
    return s.objects, s.links, dict(s.event_ids)


def test_gc_keeps_everything_refs_need_and_dry_run_equals_real_run(gc_settings: Settings, wclient, unique: str) -> None:
    _gc_round_trip(gc_settings, wclient, unique)


def test_gc_on_an_s3_warehouse_lists_and_deletes_through_s3(
    gc_settings: Settings, wclient, unique: str, s3_endpoint: str
) -> None:
    settings = s3_fixtures.s3_settings(gc_settings, s3_endpoint, "wh", bucket=f"gc-{unique}".lower())
    orphan = f"{settings.warehouse}/orphan-{unique}.parquet"  # written by no commit: garbage once old
    _put(settings, orphan)
    dry, real = _gc_round_trip(settings, wclient, unique)
    assert dry.warehouse.startswith("s3://") and all(p.startswith("s3://") for p in real.deleted)
    assert orphan in real.deleted


def _put(settings: Settings, uri: str) -> None:
    fs = pafs.S3FileSystem(
        endpoint_override=settings.s3_endpoint, access_key="k", secret_key="s", region=settings.s3_region
    )
    with fs.open_output_stream(uri[len("s3://") :]) as f:
        f.write(b"not referenced by any commit")


def _gc_round_trip(gc_settings: Settings, wclient: SyncNessieClient, unique: str) -> tuple[GcOutcome, GcOutcome]:
    w = f"t{unique}"
    branch = f"world-{w}"
    from tests.integration.test_committer import empty_root

    wclient.create_branch(branch, empty_root(wclient))
    written = WrittenWorld(w, branch, BatchCommitter(gc_settings, wclient), wclient)
    try:
        with Worlds(gc_settings, wclient) as api:
            for i in range(4):
                written.commit(f"b{i}", [obj(w, f"p{j}", "UPDATE" if i else "CREATE", i + 1, n=i) for j in range(8)])
            api.create_release(w, "v1")  # a release sharing files with the world
            fork = f"{w}-f"
            api.client.create_branch(f"world-{fork}", Reference(branch, "BRANCH", written.heads[1]))
            other = WrittenWorld(fork, f"world-{fork}", written.committer, wclient, next_offset=100)
            other.commit("f1", [obj(fork, "x1", "CREATE", 1)])
            for i in range(4, 7):
                written.commit(f"b{i}", [obj(w, f"p{j}", "UPDATE", i + 1, n=i) for j in range(8)])
            refs = [branch, f"release/{w}/v1", f"world-{fork}"]
            before = {r: _full_read(gc_settings, r) for r in refs}
            time.sleep(1.5)

            dry = run_gc(gc_settings, timedelta(seconds=1), dry_run=True, client=wclient)
            assert dry.plan.delete, "superseded metadata, manifests and files should be garbage"
            assert not dry.mark.missing
            stored_before = {f.path for f in list_files(gc_settings, dry.warehouse)}
            assert set(dry.plan.paths) <= stored_before

            real = run_gc(
                gc_settings, timedelta(seconds=1), dry_run=False, client=wclient, now=dry.cutoff + timedelta(seconds=1)
            )
            assert real.deleted == dry.plan.paths  # exactly the dry run's list
            assert real.freed_bytes == dry.plan.bytes > 0
            stored_after = {f.path for f in list_files(gc_settings, dry.warehouse)}
            assert stored_after == stored_before - set(dry.plan.paths)

            # Every reference reads as before, through every table.
            assert {r: _full_read(gc_settings, r) for r in refs} == before
            assert api.diff(f"{w}/v1", w).changes  # the release and the head still diff file by file
            again = run_gc(
                gc_settings, timedelta(seconds=1), dry_run=True, client=wclient, now=real.cutoff + timedelta(seconds=1)
            )
            assert again.plan.delete == []
            return dry, real
    finally:
        fx.cleanup_refs(wclient, unique)


def test_gc_cli(gc_settings: Settings) -> None:
    bad = CliRunner().invoke(cli, ["gc", "--older-than", "soon"], obj=gc_settings)
    assert bad.exit_code != 0 and "not a duration" in bad.output
    out = CliRunner().invoke(cli, ["gc", "--older-than", "7d", "--dry-run", "--json"], obj=gc_settings)
    assert out.exit_code == 0, out.output
    body = orjson.loads(out.output.splitlines()[-1])
    assert body["dry_run"] is True and body["files"] == [] and body["references"] >= 1


class _Churning(SyncNessieClient):
    """Nessie as other users see it during a GC: a reference vanishes, another appears after the listing."""

    def __init__(self, url: str, on_second_listing) -> None:  # type: ignore[no-untyped-def]
        super().__init__(url)
        self.listings = 0
        self.on_second_listing = on_second_listing

    def list_references(self, *a, **kw):  # type: ignore[no-untyped-def,override]
        self.listings += 1
        if self.listings == 2:
            self.on_second_listing()
        refs = super().list_references(*a, **kw)
        return refs + [Reference("gone-meanwhile-xyz", "BRANCH", "0" * 64)] if self.listings == 1 else refs


def test_gc_marks_references_created_meanwhile_and_ignores_deleted_ones(
    gc_settings: Settings, wclient, unique: str, nessie_url: str
) -> None:
    from tests.integration.test_committer import empty_root

    w = f"t{unique}"
    wclient.create_branch(f"world-{w}", empty_root(wclient))
    written = WrittenWorld(w, f"world-{w}", BatchCommitter(gc_settings, wclient), wclient)
    try:
        written.commit("b0", [obj(w, "p0", "CREATE", 1)])
        old = written.heads[-1]
        for i in range(1, 4):
            written.commit(f"b{i}", [obj(w, "p0", "UPDATE", i + 1, n=i)])
        before = _full_read(gc_settings, f"world-{w}@{old}")
        time.sleep(1.5)
        # While GC marks, someone forks a world from the old commit (outside the retention).
        fork = Reference(f"world-{w}", "BRANCH", old)
        churn = _Churning(nessie_url, lambda: wclient.create_branch(f"world-{w}-late", fork))
        with churn:
            out = run_gc(gc_settings, timedelta(seconds=1), dry_run=False, client=churn)
        assert out.deleted  # later states' superseded files went
        assert _full_read(gc_settings, f"world-{w}-late") == before  # the late fork kept its files
    finally:
        fx.cleanup_refs(wclient, unique)
