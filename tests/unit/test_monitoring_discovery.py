"""Prometheus file-based discovery: a process's target exists exactly while it runs."""

from __future__ import annotations

import json
import os
import socket

import pytest

from monitoring import discovery
from streams.lag import PartitionOffsets, lag_seconds, next_to_read, partition_lag


def test_registered_writes_a_file_sd_target_and_removes_it_on_exit(tmp_path) -> None:
    with discovery.registered(str(tmp_path), "worker", "127.0.0.1:6066") as path:
        assert path is not None and path.name == f"worker-{socket.gethostname()}-{os.getpid()}.json"
        groups = json.loads(path.read_text())
        assert groups == [
            {"targets": ["127.0.0.1:6066"], "labels": {"process": f"{socket.gethostname()}-{os.getpid()}"}}
        ]
        assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left behind
    assert list(tmp_path.iterdir()) == []


def test_registering_removes_entries_of_dead_processes_of_the_same_kind_and_host(tmp_path) -> None:
    host = socket.gethostname()
    dead = tmp_path / discovery.entry_name("worker", host, 2**22 + 12345)  # above pid_max: never alive
    other_kind = tmp_path / discovery.entry_name("lag-exporter", host, 2**22 + 12345)
    other_host = tmp_path / discovery.entry_name("worker", "elsewhere", 2**22 + 12345)
    for p in (dead, other_kind, other_host):
        p.write_text("[]")
    path = discovery.register(str(tmp_path), "worker", "127.0.0.1:6066")
    assert path is not None and path.exists()
    assert not dead.exists() and other_kind.exists() and other_host.exists()
    discovery.unregister(path)
    discovery.unregister(path)  # twice is harmless


def test_stale_entries_is_pure() -> None:
    names = ["worker-h-1.json", "worker-h-2.json", "worker-g-3.json", "lag-exporter-h-4.json", "worker-h-x.json"]
    assert discovery.stale_entries(names, "worker", "h", alive=lambda pid: pid == 2) == ["worker-h-1.json"]


def test_disabled_or_unwritable_discovery_never_raises(tmp_path) -> None:
    assert discovery.register("", "worker", "127.0.0.1:1") is None
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert discovery.register(str(blocker / "sub"), "worker", "127.0.0.1:1") is None
    with pytest.raises(ValueError, match="kind"):
        discovery.entry_name("database", "h", 1)


def test_advertised_address() -> None:
    assert discovery.advertised_address("0.0.0.0", 6066) == "127.0.0.1:6066"
    assert discovery.advertised_address("10.1.2.3", 6066) == "10.1.2.3:6066"


def test_one_lag_definition() -> None:
    assert partition_lag(end=120, low=20, committed=None) == 100
    assert partition_lag(end=120, low=20, committed=-1) == 100
    assert partition_lag(end=120, low=20, committed=115) == 5
    assert partition_lag(end=10, low=0, committed=12) == 0
    assert next_to_read(low=20, committed=None) == 20 and next_to_read(low=20, committed=30) == 30
    assert lag_seconds(100.0, None) == 0 and lag_seconds(100.0, 40.0) == 60.0 and lag_seconds(1.0, 5.0) == 0
    caught_up = PartitionOffsets("t", 0, end=5, low=0, committed=5, oldest_waiting_timestamp=1.0)
    assert caught_up.lag_seconds(100.0) == 0.0


def _up(job: str, value: str) -> dict:
    return {"metric": {"job": job, "instance": f"{job}:1"}, "value": [0, value]}


def test_doctor_says_plainly_when_no_worker_runs() -> None:
    assert discovery.describe_targets([_up("prometheus", "1"), _up("causeway-lag", "1")]) == (
        "2/2 targets up; no worker running (none discovered)"
    )
    line = discovery.describe_targets([_up("prometheus", "1"), _up("causeway", "1"), _up("causeway", "0")])
    assert line == "2/3 targets up; workers: 1/2 up; lag exporter not scraped"
