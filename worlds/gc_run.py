"""Running garbage collection: mark live files across every Nessie reference, list, sweep.

See ``worlds.gc`` for the rules. The mark reads, per reference, the tables as of the cutoff (one
``entries`` call at ``ref*<cutoff>``) and the table pointers every later commit PUT (one paged log
walk with ``fetch=ALL``); metadata files and manifests are read once each (they are immutable).
Only tables whose metadata lives under the swept warehouse are read: files of other warehouses
are neither marked nor swept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow.fs as pafs
from pyiceberg.io import load_file_io
from pyiceberg.manifest import ManifestFile
from pyiceberg.serializers import FromInputFile
from pyiceberg.table.metadata import TableMetadata

from sinks.catalog import NessieCatalog
from sinks.errors import NessieNotFound
from sinks.nessie import IcebergTable, SyncNessieClient
from streams.settings import Settings
from worlds.gc import StoredFile, SweepPlan, normalize, sweep
from worlds.history import history_filter

log = logging.getLogger(__name__)


@dataclass
class MarkStats:
    references: int = 0
    table_states: int = 0  # (metadata file, snapshot) pairs found live
    metadata_files: int = 0
    manifests: int = 0
    outside: int = 0  # live table states of other warehouses (not read)
    missing: list[str] = field(default_factory=list)  # live metadata files that do not exist


@dataclass
class GcOutcome:
    warehouse: str
    cutoff: datetime
    dry_run: bool
    plan: SweepPlan
    mark: MarkStats
    live_files: int
    deleted: list[str] = field(default_factory=list)
    freed_bytes: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "warehouse": self.warehouse,
            "cutoff": self.cutoff.isoformat(),
            "dry_run": self.dry_run,
            "files": self.plan.paths,
            "bytes": self.plan.bytes,
            "deleted": len(self.deleted),
            "freed_bytes": self.freed_bytes,
            "live_files": self.live_files,
            "kept_live": self.plan.kept_live,
            "kept_young": self.plan.kept_young,
            "references": self.mark.references,
            "missing_metadata": self.mark.missing,
        }


class _Marker:
    def __init__(self, catalog: NessieCatalog, root: str) -> None:
        self.catalog = catalog
        self.root = normalize(root).rstrip("/") + "/"
        self.live: set[str] = set()
        self.stats = MarkStats()
        self._metadata: dict[str, TableMetadata | None] = {}
        self._manifests: set[str] = set()
        self._states: set[tuple[str, int]] = set()

    def table_state(self, content: IcebergTable) -> None:
        location = content.metadata_location
        key = (location, content.snapshot_id)
        if key in self._states:
            return
        self._states.add(key)
        if not normalize(location).startswith(self.root):
            self.stats.outside += 1
            return
        self.stats.table_states += 1
        io = load_file_io(self.catalog.properties, location)
        if location not in self._metadata:
            try:
                self._metadata[location] = FromInputFile.table_metadata(io.new_input(location))
                self.stats.metadata_files += 1
            except FileNotFoundError:
                self._metadata[location] = None
                self.stats.missing.append(location)
        metadata = self._metadata[location]
        self.live.add(normalize(location))
        if metadata is None:
            return
        snapshot = metadata.snapshot_by_id(content.snapshot_id) if content.snapshot_id >= 0 else None
        if snapshot is None:
            return
        self.live.add(normalize(snapshot.manifest_list))
        for manifest in snapshot.manifests(io):
            self._manifest(io, manifest)

    def _manifest(self, io: Any, manifest: ManifestFile) -> None:
        path = normalize(manifest.manifest_path)
        self.live.add(path)
        if path in self._manifests:
            return
        self._manifests.add(path)
        self.stats.manifests += 1
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
            self.live.add(normalize(entry.data_file.file_path))


def mark(
    client: SyncNessieClient,
    catalog: NessieCatalog,
    cutoff: datetime,
    progress: Callable[[int], None] | None = None,
) -> tuple[set[str], MarkStats]:
    """Normalized paths of every file a live commit of any reference needs, under the warehouse."""
    marker = _Marker(catalog, catalog.warehouse)
    cutoff_ms = int(cutoff.timestamp() * 1000)
    flt = history_filter(since=cutoff + timedelta(microseconds=1))
    for ref in client.list_references():
        marker.stats.references += 1
        try:
            at_cutoff = client.get_entries(f"{ref.name}*{cutoff_ms}", content=True)
        except NessieNotFound:
            at_cutoff = []  # the reference has no commit that old: its later commits say it all
        for entry in at_cutoff:
            if isinstance(entry.content, IcebergTable):
                marker.table_state(entry.content)
        for commit in client.history_entries(f"{ref.name}@{ref.hash}", max_records=200, filter=flt, fetch_all=True):
            for op in commit.operations or ():
                if op.type == "PUT" and isinstance(op.content, IcebergTable):
                    marker.table_state(op.content)
        if progress is not None:
            progress(1)
    return marker.live, marker.stats


def _filesystem(settings: Settings, root: str) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, path to list, prefix that turns a listed path back into a warehouse URI)."""
    if root.startswith("s3://"):
        fs = pafs.S3FileSystem(
            endpoint_override=settings.s3_endpoint or None,
            access_key=settings.s3_access_key.reveal() or None,
            secret_key=settings.s3_secret_key.reveal() or None,
            region=settings.s3_region or None,
        )
        return fs, root[len("s3://") :], "s3://"
    return pafs.LocalFileSystem(), normalize(root), ""


def list_files(settings: Settings, root: str) -> list[StoredFile]:
    fs, path, prefix = _filesystem(settings, root)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    return [
        StoredFile(prefix + i.path, i.size or 0, (i.mtime or datetime.now(UTC)).astimezone(UTC))
        for i in infos
        if i.type == pafs.FileType.File
    ]


def run_gc(
    settings: Settings,
    older_than: timedelta,
    *,
    dry_run: bool,
    now: datetime | None = None,
    client: SyncNessieClient | None = None,
    progress: Callable[[int], None] | None = None,
) -> GcOutcome:
    """Mark, list and (unless ``dry_run``) delete; a dry run lists exactly what the real run would delete."""
    cutoff = (now or datetime.now(UTC)) - older_than
    own = client is None
    client = client or SyncNessieClient.from_settings(settings)
    try:
        catalog = NessieCatalog.from_settings(settings, settings.main_branch, client=client)
        files = list_files(settings, catalog.warehouse)  # listed before marking: a file written later is young
        live, stats = mark(client, catalog, cutoff, progress)
    finally:
        if own:
            client.close()
    plan = sweep(files, live, cutoff)
    outcome = GcOutcome(catalog.warehouse, cutoff, dry_run, plan, stats, len(live))
    if dry_run:
        return outcome
    fs, _, prefix = _filesystem(settings, catalog.warehouse)
    for f in plan.delete:
        try:
            fs.delete_file(f.path[len(prefix) :] if prefix else normalize(f.path))
        except FileNotFoundError:
            continue
        outcome.deleted.append(f.path)
        outcome.freed_bytes += f.size
    return outcome
