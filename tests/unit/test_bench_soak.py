"""The soak's verdict: flat means the last three windows after warm-up are at most 1.3 × the first three."""

from bench.soak import _flat


def test_a_series_that_grows_by_more_than_the_bar_is_growing() -> None:
    assert _flat([9, 9, 1.0, 1.0, 1.0, 1.2, 1.4, 1.4, 1.4])["verdict"] == "growing"


def test_a_series_within_the_bar_is_flat_and_warm_up_windows_do_not_count() -> None:
    verdict = _flat([50, 40, 1.0, 1.0, 1.0, 1.1, 1.2, 1.3, 1.2])
    assert verdict["verdict"] == "flat" and verdict["ratio"] == 1.233


def test_a_lag_under_its_floor_is_flat_even_from_zero() -> None:
    assert _flat([0, 0, 0, 0, 0, 0, 10, 12, 900], floor=5000)["verdict"] == "flat"
    assert _flat([0, 0, 0, 0, 0, 0, 10, 12, 90_000], floor=5000)["verdict"] == "growing"


def test_too_few_windows_give_no_verdict() -> None:
    assert _flat([1, 1, 1, 1, 1])["verdict"] == "too short"


def test_a_restamped_chunk_has_fresh_ids_and_keys_and_its_causes_point_into_it() -> None:
    """Every chunk of the soak is one generated template re-stamped: chunks never share an event id
    or a pk (the tables must keep growing, the dedupe must not drop them), and a chunk's causes are
    its own events."""
    from dataclasses import replace

    from bench.soak import MARK, restamp
    from cli.workload import WorkloadParams, generate
    from models.events import ChangeEvent, decode

    params = replace(WorkloadParams(), events=400, worlds=2, keys=50, id_prefix=f"run-{MARK}-", pk_prefix=MARK)
    template = [(r.kind, r.key, r.value) for r in generate(params).records]
    chunks = [restamp(template, n) for n in (0, 7)]
    events = [[e for _, key, value in c if isinstance(e := decode(value, key), ChangeEvent)] for c in chunks]
    ids = [{e.event_id for e in evs} for evs in events]
    pks = [{e.entity_pk for e in evs} for evs in events]
    assert len(events[0]) == len(events[1]) > 300
    assert not ids[0] & ids[1] and not pks[0] & pks[1]
    assert all("Z000007Z" in i for i in ids[1]) and not any(MARK.encode() in v for _, _, v in chunks[1])
    causes = [e.caused_by for e in events[1] if e.caused_by]
    assert causes and all(c in ids[1] for c in causes)


def test_a_slow_scrape_of_the_workers_metrics_does_not_stop_the_event_loop() -> None:
    # The soak publishes on the loop that takes its windows; a scrape that blocked the loop paused the
    # publisher, which then sent the missed seconds as one burst.
    import asyncio
    import time

    from bench.soak import scrape

    class SlowWorker:
        def metrics_text(self) -> str:
            time.sleep(0.3)
            return "causeway_commit_duration_seconds_count 3.0\n"

    async def main() -> tuple[list[str], int]:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        t = asyncio.create_task(ticker())
        texts = await scrape([SlowWorker(), SlowWorker()])
        t.cancel()
        return texts, ticks

    texts, ticks = asyncio.run(main())
    assert texts == ["causeway_commit_duration_seconds_count 3.0\n"] * 2
    assert ticks >= 20  # 0.6 s of scraping, a tick every 10 ms while it ran


def test_windows_are_taken_on_their_schedule_by_a_task_of_their_own() -> None:
    import asyncio
    import time

    from bench.soak import _windows

    async def main() -> list[dict[str, object]]:
        windows: list[dict[str, object]] = []

        async def take(i: int) -> dict[str, object]:
            return {"window": i, "at": time.monotonic()}

        started = time.monotonic()
        await _windows(take, windows, started, duration=0.35, every=0.1)
        return [dict(w, at=float(w["at"]) - started) for w in windows]  # type: ignore[arg-type]

    got = asyncio.run(main())
    assert [w["window"] for w in got] == [0, 1, 2]  # none after the duration
    assert all(float(w["at"]) >= 0.1 * (i + 1) - 0.005 for i, w in enumerate(got))  # type: ignore[arg-type]
