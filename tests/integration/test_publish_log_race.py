"""The publish log under concurrent appends (the API's load test runs many PublishAudit at once)."""

from __future__ import annotations

import threading

import pytest

from sinks.nessie import SyncNessieClient
from streams.settings import Settings
from tests.nessie_faults import lose_first_answer
from worlds.publish_log import PublishLog

pytestmark = pytest.mark.integration


def test_concurrent_appends_to_one_log_all_land(settings: Settings, unique: str) -> None:
    branch = f"publish-log-race-{unique}"
    nessie = SyncNessieClient.from_settings(settings)
    errors: list[Exception] = []
    start = threading.Barrier(8)

    def append(n: int) -> None:
        log = PublishLog(SyncNessieClient.from_settings(settings), branch)
        start.wait()
        try:
            for i in range(3):
                log.append({"kind": "audit", "plan_id": f"pl-{n}-{i}"})
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=append, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        got = sorted(e["plan_id"] for e in PublishLog(nessie, branch).entries())
        assert got == sorted(f"pl-{n}-{i}" for n in range(8) for i in range(3))
    finally:
        ref = nessie.get_reference(branch)
        nessie.delete_reference(branch, ref.hash, "BRANCH")
        nessie.close()


def test_an_append_whose_answer_is_lost_is_found_by_its_commit_id_and_logged_once(
    settings: Settings, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    branch = f"publish-log-lost-{unique}"
    nessie = SyncNessieClient.from_settings(settings)
    try:
        log = PublishLog(nessie, branch)
        log.append({"kind": "audit", "plan_id": "pl-0"})  # creates the branch
        landed = lose_first_answer(nessie, monkeypatch)
        got = log.append({"kind": "audit", "plan_id": "pl-1"})
        assert landed == [got]  # the lost commit was found, not made again
        monkeypatch.undo()
        assert [e["plan_id"] for e in PublishLog(nessie, branch).entries()] == ["pl-0", "pl-1"]
    finally:
        ref = nessie.get_reference(branch)
        nessie.delete_reference(branch, ref.hash, "BRANCH")
        nessie.close()
