"""Reads of a branch through ``sinks.readback`` when its files are gone."""

from __future__ import annotations

from pathlib import Path

import pytest

from sinks.catalog import NessieCatalog
from sinks.errors import TableUnreadable
from sinks.readback import recent_event_ids
from streams.settings import Settings
from tests.missing_files import missing_manifest_list


def test_recent_event_ids_of_a_log_whose_manifest_list_is_gone_raise_table_unreadable(tmp_path: Path) -> None:
    """Mark repair's read of a broken branch: TableUnreadable with the path, never pyiceberg's
    FileNotFoundError (an OSError a caller would retry as an outage). Before: the raw error escaped."""
    broken = missing_manifest_list(tmp_path)
    cat = NessieCatalog(client=broken, ref="main", warehouse=broken.warehouse)  # type: ignore[arg-type]
    with pytest.raises(TableUnreadable) as err:
        recent_event_ids(Settings(warehouse=broken.warehouse), "world-broken", catalog=cat)
    assert broken.manifest_list.removeprefix("file://") in err.value.path
    assert not isinstance(err.value, OSError)
