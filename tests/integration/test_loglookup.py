"""The log's lookups by event id (sinks/loglookup.py) when the key filters outgrow their memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sinks.committer import BatchCommitter
from sinks.keyfilter import KeyFilter, Probe
from sinks.nessie import SyncNessieClient
from sinks.rowdelta import FileCache
from streams.settings import Settings
from tests.integration.commits import batch, obj

pytestmark = pytest.mark.integration


def test_lookups_over_more_key_filters_than_memory_holds_read_each_log_file_once(
    client: SyncNessieClient, sink_settings: Settings, world: str, tmp_path: Path, monkeypatch: Any
) -> None:
    """The cliff of a 30-minute soak at 5,000/s: once the filters a lookup probes no longer fit in
    their budget, each lookup evicted what the next needed and rebuilt it by reading the file's
    ``event_id`` column (62 % of the worker's time). Here six log files' filters, two of which fit
    in memory, are probed by three lookups of absent ids: each file is read from storage once (its
    filter built), then the evicted filters come back from the worker's local spill. Failed
    before: every lookup read every file (18 reads; the filters did not even fit an eighth of
    this cache)."""
    from pyiceberg.io.pyarrow import PyArrowFileIO

    settings = sink_settings.replace(data_dir=str(tmp_path / "data"))
    writer = BatchCommitter(settings, client)
    offset = 0
    for k in range(6):
        events = [obj(world, f"p{k}-{j}", "CREATE", 1) for j in range(2100)]
        writer.commit_batch(batch(world, f"b{k}", events, offset))
        offset += len(events)
    log = writer.catalog(f"world-{world}").load_table(("onto", "entity_events"))
    paths = [t.file.file_path for t in log.scan().plan_files()]
    assert len(paths) == 6
    # The ids asked are absent ones that no file's filter takes for a "maybe" (a false positive,
    # ~10^-4 each, is read, as it must be).
    filters = [KeyFilter.build(pq.read_table(p.removeprefix("file://")).column("event_id")) for p in paths]
    absent = [
        i
        for i in (f"absent-{n}" for n in range(700))
        if not any(k.may_hold(Probe.of(pa.array([i], pa.string()))) for k in filters)
    ][:600]
    assert len(absent) == 600

    reader = BatchCommitter(settings, client, index_cache_bytes=2 * 2 * (filters[0].nbytes + FileCache.ENTRY_BYTES))
    opened: list[str] = []
    real = PyArrowFileIO.new_input

    def counting(self: PyArrowFileIO, location: str) -> Any:
        opened.append(location)
        return real(self, location)

    monkeypatch.setattr(PyArrowFileIO, "new_input", counting)
    for n in range(3):
        assert reader.applied_events(world, set(absent[n * 200 : (n + 1) * 200])) == set()
    assert {p: opened.count(p) for p in paths} == {p: 1 for p in paths}
    spill = reader.file_cache.spill
    assert spill is not None and spill.reads >= 4  # the four that memory could not hold, read back
    # A filter read back from the spill still says "maybe" for every id its file holds.
    held = [pq.read_table(p.removeprefix("file://")).column("event_id")[7].as_py() for p in paths]
    assert reader.applied_events(world, set(held)) == set(held)
