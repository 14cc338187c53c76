"""bench/contender.py: the contenders create their tables with the layout the settings configure."""

from __future__ import annotations

from typing import Any, cast

from pyiceberg.exceptions import NoSuchTableError

from bench.contender import load_or_create
from sinks.catalog import NessieCatalog
from sinks.tables import COMMON, EVENTS, table_properties


class _EmptyCatalog:
    """A branch without the table: records what ``create_table`` is asked for."""

    def __init__(self) -> None:
        self.created: list[tuple[tuple[str, str], dict[str, Any]]] = []

    def load_table(self, identifier: tuple[str, str]) -> Any:
        raise NoSuchTableError(".".join(identifier))

    def create_table(self, identifier: tuple[str, str], schema: Any, **kwargs: Any) -> Any:
        self.created.append((identifier, kwargs))
        return identifier


def test_a_contender_creates_a_projection_with_the_configured_buckets_and_its_sort_order() -> None:
    """The contenders created their tables with the module default's spec (no buckets) and no sort
    order, whatever CAUSEWAY_PROJECTION_BUCKETS said: a bucketed causeway was compared with
    unbucketed contenders."""
    cat = _EmptyCatalog()
    for tdef in (COMMON, EVENTS):
        load_or_create(cast(NessieCatalog, cat), "onto", tdef, projection_buckets=4, target_file_bytes=1024)
    (common_id, common), (events_id, events) = cat.created
    assert common_id == ("onto", "entity_common") and events_id == ("onto", "entity_events")
    assert common["partition_spec"] == COMMON.spec_with(4) != COMMON.spec
    assert [f.transform for f in common["partition_spec"].fields][1].num_buckets == 4
    assert common["sort_order"] == COMMON.sort_order and common["sort_order"].fields
    assert events["partition_spec"] == EVENTS.spec_with(4) == EVENTS.spec  # the log has no key buckets
    assert common["properties"] == table_properties(1024)
