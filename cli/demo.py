"""`causeway demo`: the README's main job on local defaults, end to end against the real services.

Starts a worker process, creates the demo worlds, publishes a generated workload (creates, updates,
deletes, links, causal chains with late causes, producer-retry duplicates and bad records), waits
until the consumer group has committed everything, then reads the branches back and prints what
landed where.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import click
import httpx
from aiokafka import AIOKafkaProducer

from cli.workload import WorkloadParams, expected_state, generate
from models.events import EntityKind
from models.worlds import WorldNaming
from sinks.committer import PROP_BATCH
from sinks.nessie import NessieClient
from sinks.readback import read_world
from streams.lag_probe import OffsetProbe
from streams.security import kafka_client_options
from streams.settings import Settings
from streams.topics import ensure_topics
from worlds.manager import WorldManager

ROOT = Path(__file__).resolve().parents[1]


def _healthy(port: int) -> dict | None:
    try:
        resp = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
        return resp.json() if resp.status_code == 200 else None
    except httpx.HTTPError:
        return None


def _start_worker(settings: Settings, log_path: Path) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "worker", "--web-port", str(settings.web_port)],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=log_path.open("ab"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise click.ClickException(f"the worker exited during start-up; see {log_path}")
        if _healthy(settings.web_port):
            return proc
        time.sleep(0.3)
    proc.terminate()
    raise click.ClickException(f"the worker did not become healthy in 90 s; see {log_path}")


async def _publish(settings: Settings, records: list, label: str) -> float:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, linger_ms=10, acks="all", **kafka_client_options(settings)
    )
    await producer.start()
    started = time.monotonic()
    try:
        with click.progressbar(records, label=label, show_pos=True, show_eta=True) as bar:
            for r in bar:
                topic = settings.objects_topic if r.kind is EntityKind.OBJECT else settings.links_topic
                await producer.send(topic, r.value, key=r.key)
        await producer.flush()
    finally:
        await producer.stop()
    return time.monotonic() - started


async def _wait_drained(settings: Settings, total: int, limit_s: float) -> float:
    topics = (settings.objects_topic, settings.links_topic)
    started = time.monotonic()
    last = None
    # One probe for the whole wait: its clients are kept between polls (a bootstrap per poll otherwise).
    probe = OffsetProbe(settings.kafka_bootstrap, kafka_options=kafka_client_options(settings))
    try:
        with click.progressbar(length=total, label="applying   ", show_pos=True, show_eta=True) as bar:
            while time.monotonic() - started < limit_s:
                lag = sum((await probe.group_lag(settings.app_id, topics)).values())
                done = max(0, total - min(lag, total))
                bar.update(done - bar.pos)
                if lag == 0:
                    return time.monotonic() - started
                if lag != last:
                    last = lag
                await asyncio.sleep(0.5)
    finally:
        await probe.close()
    raise click.ClickException(f"events still unprocessed after {limit_s:.0f} s (lag {last})")


async def _commits_since(nessie: NessieClient, branch: str, base: str) -> int:
    count = 0
    async for page in nessie.history(branch, max_records=200):
        for entry in page:
            if entry.hash == base:
                return count
            if PROP_BATCH in entry.properties:
                count += 1
    return count


@click.command()
@click.option("--events", default=5000, show_default=True, help="How many records to publish.")
@click.option("--worlds", "n_worlds", default=3, show_default=True, help="prod plus this many minus one demo worlds.")
@click.option("--keys", default=300, show_default=True, help="Objects per world.")
@click.option("--seed", default=7, show_default=True, help="Workload seed (the workload is deterministic).")
@click.option("--keep-worker", is_flag=True, help="Leave the worker running after the demo.")
@click.option("--timeout", default=300.0, show_default=True, help="Give up waiting after this many seconds.")
@click.pass_obj
def demo(
    settings: Settings, events: int, n_worlds: int, keys: int, seed: int, keep_worker: bool, timeout: float
) -> None:
    """Run the pipeline end to end on local defaults and print what landed on each world branch.

    Each run publishes new events (ids carry the run's timestamp), so the numbers are this run's.

    \b
    Example:
      causeway demo --events 20000 --worlds 3
    """
    asyncio.run(_demo(settings, events, n_worlds, keys, seed, keep_worker, timeout))


async def _demo(
    settings: Settings, events: int, n_worlds: int, keys: int, seed: int, keep_worker: bool, limit_s: float
) -> None:
    run_id = time.strftime("%Y%m%d%H%M%S")
    params = WorkloadParams(
        events=events,
        worlds=n_worlds,
        keys=keys,
        seed=seed,
        world_prefix="demo-",
        id_prefix=f"r{run_id}-",
        pk_prefix=f"r{run_id}",  # fresh entities per run: an earlier run's newer versions stay apart
    )
    workload = generate(params)
    naming = WorldNaming(settings.prod_world, settings.main_branch)
    created = await ensure_topics(settings)
    if created:
        click.echo(f"created topics: {', '.join(created)}")
    async with NessieClient.from_settings(settings) as nessie:
        manager = WorldManager(nessie, naming)
        bases: dict[str, str] = {}
        for world in params.world_ids():
            w, new = await manager.create(world)
            bases[world] = w.hash
            click.echo(f"world {world:10} branch {w.branch:16} {'created' if new else 'exists'} at {w.hash[:12]}")

        proc = None
        if _healthy(settings.web_port):
            click.echo(f"using the worker already running on port {settings.web_port}")
        else:
            log_path = ROOT / ".causeway" / "demo-worker.log"
            click.echo(f"starting a worker (metrics on :{settings.web_port}, log {log_path})")
            proc = _start_worker(settings, log_path)
        before = _healthy(settings.web_port) or {}
        try:
            pub_s = await _publish(settings, workload.records, "publishing ")
            apply_s = await _wait_drained(settings, len(workload.records), limit_s)
            after = _healthy(settings.web_port) or {}
        finally:
            if proc is not None and not keep_worker:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()

        def delta(key: str) -> int:
            return int(after.get(key, 0)) - int(before.get(key, 0))

        total = len(workload.records)
        click.echo("")
        click.echo(f"== demo run {run_id}: {total} records published in {pub_s:.1f}s")
        click.echo(
            f"   consumed {delta('consumed')}, applied {delta('applied')}, duplicates dropped "
            f"{delta('duplicates')}, dead-lettered {delta('dead_lettered')} (to {settings.dlq_topic})"
        )
        rate = total / max(pub_s + apply_s, 1e-9)
        click.echo(f"   drained {apply_s:.1f}s after publishing ended: {rate:,.0f} records/s end to end")
        bad = Counter(r.value[:12] for r in workload.records if r.event is None)
        click.echo(
            f"   bad records in the workload: {sum(bad.values())}; duplicates published: "
            f"{total - workload.bad_count - len(workload.valid_events)}"
        )
        model = expected_state(workload.valid_events)
        click.echo("")
        click.echo(
            f"{'world':10} {'branch':16} {'commits':>7} {'entity_events':>13} {'entity_common':>13} "
            f"{'entity_edge':>11}  matches model"
        )
        for world in params.world_ids():
            branch = naming.branch(world)
            commits = await _commits_since(nessie, branch, bases[world])
            state = await asyncio.to_thread(read_world, settings, world)
            rows = state.rows()
            want = model.get(world)
            ours = {e for e in state.event_ids if e.startswith(params.id_prefix)}
            mine = params.pk_prefix
            ok = (
                want is not None
                and ours == want.event_ids
                and not state.duplicate_event_ids
                and {k: v for k, v in state.objects.items() if k.startswith(mine)} == want.objects
                and {k: v for k, v in state.links.items() if k.startswith(mine)} == want.links
            )
            click.echo(
                f"{world:10} {branch:16} {commits:>7} {rows['entity_events']:>13} "
                f"{rows['entity_common']:>13} {rows['entity_edge']:>11}  {'yes' if ok else 'NO'}"
            )
    click.echo("")
    click.echo(f"metrics:    http://127.0.0.1:{settings.web_port}/metrics (while a worker runs)")
    click.echo(f"prometheus: {settings.prometheus_url}/graph?g0.expr=sum%20by%20(world)(causeway_events_total)")
    click.echo("worlds:     causeway worlds list")
