"""The event log's compaction through the committer on the real Nessie: bounded merges, every row kept, sorted."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from sinks.committer import BatchCommitter
from sinks.logcompact import is_sorted, live_data_files
from sinks.nessie import SyncNessieClient
from sinks.rowdelta import RowDelta
from sinks.rowfiles import read_data_file
from sinks.rows import EVENTS_SORT
from streams.settings import Settings
from tests.integration.commits import batch, obj

pytestmark = pytest.mark.integration


def test_log_merges_stay_under_the_row_bound_and_keep_every_row_once_in_sort_order(
    client: SyncNessieClient, sink_settings: Settings, world: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Twelve flushes of 12 rows in one day: a full tier is merged in groups of at most
    ``log_merge_max_rows`` rows (failed before: no such bound, the 8+ files of the tier were one
    merge of 96+ rows), and the log still holds every event once, each file sorted."""
    merged: list[int] = []  # rows of the log files each merge removed
    real_remove = RowDelta.remove

    def recording(self: RowDelta, files: Iterable[Any]) -> RowDelta:
        files = list(files)
        log = [f for f in files if "entity_events" in f.file_path]
        if log:
            merged.append(sum(f.record_count for f in log))
        return real_remove(self, files)

    monkeypatch.setattr(RowDelta, "remove", recording)
    committer = BatchCommitter(sink_settings.replace(log_merge_max_rows=40), client)
    ids: list[str] = []
    for n in range(12):
        events = [obj(world, f"p{n:02}-{i:02}", "CREATE", 1, n=n) for i in range(12)]
        ids += [e.event_id for e in events]
        committer.commit_batch(batch(world, f"b{n}", events, 12 * n))
    assert merged and max(merged) <= 40
    table = committer.catalog(f"world-{world}").load_table((sink_settings.namespace, "entity_events"))
    files = live_data_files(table.metadata, table.io)
    assert len(files) < 12  # merged
    assert sorted(table.scan(selected_fields=("event_id",)).to_arrow().column("event_id").to_pylist()) == sorted(ids)
    assert all(is_sorted(read_data_file(table, p), [k for k, _ in EVENTS_SORT]) for p in files)
