"""GC planning (pure): durations and the sweep rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from worlds.gc import GcError, StoredFile, normalize, parse_duration, sweep

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)


def test_parse_duration() -> None:
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("1d12h") == timedelta(days=1, hours=12)
    assert parse_duration("45s") == timedelta(seconds=45) and parse_duration("2w") == timedelta(weeks=2)
    for bad in ("", "7", "7x", "d7", "1d junk"):
        with pytest.raises(GcError):
            parse_duration(bad)


def test_sweep_deletes_only_old_files_nothing_live_references() -> None:
    old, young = NOW - timedelta(days=8), NOW - timedelta(hours=1)
    files = [
        StoredFile("file:///w/a.parquet", 10, old),  # live (spelled differently by the manifest)
        StoredFile("/w/b.parquet", 20, old),  # garbage
        StoredFile("/w/c.parquet", 30, young),  # garbage but too young: a writer may be about to commit it
    ]
    plan = sweep(files, {normalize("file:/w/a.parquet")}, NOW - timedelta(days=7))
    assert plan.paths == ["/w/b.parquet"] and plan.bytes == 20
    assert (plan.kept_live, plan.kept_young) == (1, 1)
