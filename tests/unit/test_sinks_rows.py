"""The log's and the projections' Arrow rows (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

from sinks.committed_offsets import Source
from sinks.rows import events_arrow, projection_arrow
from sinks.tables import COMMON, EVENTS
from tests.factories import change_event


def test_every_row_carries_the_flushs_commit_time_and_batch_id_as_the_tables_types() -> None:
    now = datetime(2026, 12, 1, 22, 0, 0, 123456, tzinfo=UTC)
    events = [change_event(f"e{i}", pk=f"p{i}", entity_type="Person", after={"v": i}) for i in range(3)]
    log = events_arrow([(e, Source("t", 0, i)) for i, e in enumerate(events)], "b-1", now, set())
    objects = projection_arrow(COMMON, events, "b-1", now)
    for table, schema in ((log, EVENTS.arrow_schema), (objects, COMMON.arrow_schema)):
        assert table.schema.field("committed_at").type == schema.field("committed_at").type
        assert table.column("committed_at").to_pylist() == [now] * 3
        assert table.column("batch_id").to_pylist() == ["b-1"] * 3
    assert events_arrow([], "b-2", now, set()).num_rows == 0
