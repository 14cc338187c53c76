"""The worker's health model (monitoring.health): loop states, liveness apart from readiness."""

from __future__ import annotations

import asyncio

from monitoring.health import CounterMeter, Health, LoopProgress, meter_method


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _all_up(h: Health) -> None:
    for name in ("kafka", "redis", "nessie"):
        h.set_dependency(name, True)


def test_unprobed_dependencies_are_not_ready_but_live() -> None:
    h = Health(clock=Clock())
    for name in ("kafka", "redis", "nessie"):
        h.register_dependency(name)
    r = h.report()
    assert (r.status, r.live, r.ready) == ("degraded", True, False)
    assert {d.verdict for d in r.dependencies} == {"unknown"}


def test_a_dependency_down_degrades_readiness_not_liveness() -> None:
    clock = Clock()
    h = Health(clock=clock)
    _all_up(h)
    assert h.report().status == "ok"
    h.set_dependency("nessie", False, "down: connection refused")
    clock.now += 7
    r = h.report()
    assert (r.status, r.live, r.ready) == ("degraded", True, False)
    assert r.reasons == ("nessie down: down: connection refused",)
    assert r.to_json()["dependencies"]["nessie"]["seconds_in_state"] == 7.0


def test_waiting_records_without_progress_make_a_loop_stuck_and_the_worker_not_live() -> None:
    clock = Clock()
    h = Health(clock=clock)
    _all_up(h)
    settled, waiting = [0], [0]
    meter = CounterMeter(lambda: settled[0], lambda: waiting[0], clock)
    h.register_loop("intake", meter.progress, stall_after_s=60)
    clock.now += 500
    assert h.report().to_json()["loops"]["intake"]["state"] == "idle"  # nothing waits: not stuck
    waiting[0] = 5
    settled[0] = 1  # progress, seen by the next report (probes are sampled)
    assert h.report().ready
    clock.now += 59
    assert h.report().ready
    clock.now += 2
    r = h.report()
    assert r.to_json()["loops"]["intake"]["state"] == "stuck"
    assert (r.status, r.live, r.ready) == ("failing", False, False)
    settled[0] = 2
    assert h.report().ready


def test_a_stuck_loop_while_a_dependency_is_down_is_live_a_restart_would_not_help() -> None:
    clock = Clock()
    h = Health(clock=clock)
    _all_up(h)
    h.set_dependency("redis", False, "down")
    h.register_loop("intake", lambda: LoopProgress(None, 3), stall_after_s=10)
    clock.now += 11
    r = h.report()
    assert (r.status, r.live, r.ready) == ("degraded", True, False)


def test_a_stopped_loop_is_not_live_and_a_broken_probe_is_reported() -> None:
    clock = Clock()
    h = Health(clock=clock)
    _all_up(h)
    h.register_loop("schema-sync", lambda: LoopProgress(clock(), None, running=False), 60)

    def broken() -> LoopProgress:
        raise RuntimeError("boom")

    h.register_loop("cdc-ingest", broken, 60)
    r = h.report()
    assert not r.live
    loops = r.to_json()["loops"]
    assert loops["schema-sync"]["state"] == "stopped"
    assert "boom" in loops["cdc-ingest"]["detail"]


def test_a_metered_poll_loop_is_stuck_when_it_stops_completing_steps() -> None:
    clock = Clock()

    class Loop:
        async def step(self) -> int:
            return 1

    loop = Loop()
    h = Health(clock=clock)
    _all_up(h)
    h.register_loop("schema-sync", meter_method(loop, clock=clock).progress, stall_after_s=30)
    clock.now += 31
    assert not h.report().ready  # never polled since registration
    assert asyncio.run(loop.step()) == 1
    assert h.report().ready
    clock.now += 31
    assert h.report().to_json()["loops"]["schema-sync"]["state"] == "stuck"


def test_a_metered_sync_method_counts_passes() -> None:
    clock = Clock()

    class Rec:
        def worlds(self) -> list[str]:
            return ["prod"]

    rec = Rec()
    meter = meter_method(rec, "worlds", clock)
    assert rec.worlds() == ["prod"]
    assert meter.progress().last_progress == clock.now and meter.calls == 1


def test_a_loop_reporting_its_own_status_is_stuck_when_records_wait_without_a_commit() -> None:
    from dataclasses import dataclass

    from monitoring.health import status_probe

    @dataclass
    class Status:  # the shape of the CDC ingest's IngestStatus
        started_at: float | None
        last_commit_at: float | None
        records_waiting: int
        last_failure: str | None

    clock, wall = Clock(), [5_000.0]
    st = Status(4_000.0, None, 0, None)
    h = Health(clock=clock)
    _all_up(h)
    h.register_loop("cdc-ingest", status_probe(lambda: st, wall=lambda: wall[0], clock=clock), 120)
    assert h.report().ready  # nothing waits
    st.records_waiting, st.last_failure = 7, "produce failed: KafkaTimeoutError"
    loop = h.report().to_json()["loops"]["cdc-ingest"]
    assert loop["state"] == "stuck" and loop["detail"].startswith("produce failed")  # 1,000 s since start
    st.last_commit_at = wall[0] - 10
    assert h.report().ready
