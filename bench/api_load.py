"""The world manager API under load, and the API server as a real process (tests use it too).

``python -m bench.api_load --clients 50 --seconds 60`` starts ``causeway serve`` on a unique prod
branch holding committed events (written by the real ``BatchCommitter``), then runs N client
threads mixing reads (GetWorld, ListWorlds, GetCommitHistory, ListReleases, QueryAt) and writes:
CreateWorld (sent twice with one idempotency key), CreateRelease and DeleteWorld; merge cycles
(ForkWorld, events committed on the fork, MergeWorld back into the client's home world); publish
cycles (ForkWorld, events committed on the fork, PublishAudit, PublishApprove, PublishRun sent twice
with one key and once more with a new key, DeleteWorld; see ``_publish_cycle``). It reports
requests/s, p50/p99 latency per kind (read, write, merge, publish), errors (must be zero), the load
average, and checks that no action ran twice: the audit log (no idempotency key ran its action more
than once) and the publish log (no plan published more than once). Everything it creates is removed
at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import threading
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from api.auth import Role, new_token, token_line
from api.client import WorldClient
from bench.procs import PYTHON, ROOT, free_port, worker_env
from models.events import ChangeEvent, ChangeType, EntityKind
from sinks.committer import Batch, BatchCommitter, Source
from sinks.nessie import Reference, SyncNessieClient
from streams.settings import Settings
from worlds.publish_log import PublishLog

#: Events committed on prod before the load, and on each fork a merge or publish cycle makes.
SEED_EVENTS, CYCLE_EVENTS = 20, 3
TOPIC = "bench.api_load"


@dataclass
class ApiProcess:
    """``causeway serve`` as a subprocess, with one token per role."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    tokens: dict[str, str]  # role name → token
    settings: Settings

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, role: str | None = "admin", token: str | None = None) -> WorldClient:
        """A client with the role's token (or ``token``), over TLS when the server has a certificate."""
        token = token if token is not None else self.tokens.get(role or "", "")
        return WorldClient(self.target, token, ca_file=self.settings.api_tls_cert)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def audit(self) -> list[dict[str, object]]:
        path = Path(self.settings.api_audit_log)
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def write_tokens(path: Path) -> dict[str, str]:
    tokens = {r.name: new_token() for r in Role}
    path.write_text("".join(token_line(f"test-{role}", Role[role], tok) + "\n" for role, tok in tokens.items()))
    return tokens


def start_api(
    settings: Settings,
    tmp: Path,
    *,
    tokens: dict[str, str] | None = None,
    fault: str | None = None,
    port: int | None = None,
    extra_env: dict[str, str] | None = None,
    timeout: float = 60.0,
) -> ApiProcess:
    """Start ``causeway serve`` configured by ``settings`` and wait until health checking says SERVING."""
    tokens_file = tmp / "api-tokens"
    if tokens is None:
        tokens = write_tokens(tokens_file)
    settings = settings.replace(api_tokens_file=str(tokens_file), api_audit_log=str(tmp / "api-audit.jsonl"))
    port = port or free_port()
    env = worker_env(settings)
    env.update(extra_env or {})
    if fault:
        env["CAUSEWAY_FAULT"] = fault
    log = tmp / f"api-{port}-{uuid.uuid4().hex[:4]}.log"
    argv = [PYTHON, "-m", "cli.main", "serve", "--bind", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    server = ApiProcess(proc, port, log, tokens, settings)
    deadline = time.monotonic() + timeout
    cert = settings.api_tls_cert
    creds = grpc.ssl_channel_credentials(Path(cert).read_bytes()) if cert else None
    with grpc.secure_channel(server.target, creds) if creds else grpc.insecure_channel(server.target) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.monotonic() < deadline:
            if not server.alive():
                raise RuntimeError(f"API server exited at start-up; log:\n{log.read_text()[-3000:]}")
            try:
                if (
                    stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                    == health_pb2.HealthCheckResponse.SERVING
                ):
                    return server
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"API server not serving in {timeout:.0f}s; log:\n{log.read_text()[-3000:]}")


@dataclass
class Tally:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, kind: str, seconds: float) -> None:
        with self.lock:
            self.latencies[kind].append(seconds)

    examples: dict[str, str] = field(default_factory=dict)

    def error(self, kind: str, exc: Exception) -> None:
        rpc = isinstance(exc, grpc.RpcError)
        name = f"{kind}: {exc.code().name if rpc else type(exc).__name__}"  # type: ignore[attr-defined]
        with self.lock:
            self.errors[name] += 1
            self.examples.setdefault(name, exc.details() if rpc else str(exc))  # type: ignore[attr-defined]


class Writer:
    """Commits events onto a world's branch with the real committer (what a worker's flush does).

    Offsets come from one counter for the whole run: a fork inherits its parent's committed offsets,
    so a reused offset would be taken for a redelivery and skipped.
    """

    _offsets = iter(range(10**12))
    _lock = threading.Lock()

    def __init__(self, settings: Settings) -> None:
        self.client = SyncNessieClient.from_settings(settings)
        self.committer = BatchCommitter(settings, self.client)

    def commit(self, world: str, batch_id: str, pks: list[str]) -> str:
        with Writer._lock:
            offsets = [next(Writer._offsets) for _ in pks]
        items = [(_event(world, pk), Source(TOPIC, 0, off)) for pk, off in zip(pks, offsets, strict=True)]
        return self.committer.commit_batch(Batch.from_sources(world, batch_id, items)).hash

    def close(self) -> None:
        self.client.close()


def _event(world: str, pk: str) -> ChangeEvent:
    return ChangeEvent(
        event_id=f"{world}-{pk}-{uuid.uuid4().hex[:8]}",
        world_id=world,
        kind=EntityKind.OBJECT,
        entity_type="person",
        entity_pk=pk,
        change_type=ChangeType.CREATE,
        version=1,
        before=None,
        after={"name": f"name-{pk}"},
        caused_by=None,
        causal_order=None,
        occurred_at_ms=1_700_000_000_000,
        schema_version=0,
        source="bench",
    )


def _timed(tally: Tally, kind: str, fn):
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - counted
        tally.error(kind, exc)
        return None
    tally.record(kind, time.perf_counter() - t0)
    return out


def _fork_with_events(c: WorldClient, tally: Tally, writer: Writer, home: str, world: str, key: str) -> bool:
    """Fork ``home`` as ``world`` over the API, then commit new entities on the fork (not timed: no RPC)."""
    if _timed(tally, "write", lambda: c.fork_world(home, world, idempotency_key=key + "-f")) is None:
        return False
    try:
        writer.commit(world, f"{world}-b", [f"{world}-e{j}" for j in range(CYCLE_EVENTS)])
    except Exception as exc:  # noqa: BLE001 - counted
        tally.error("commit", exc)
        return False
    return True


def _merge_cycle(c: WorldClient, tally: Tally, writer: Writer, home: str, world: str, key: str) -> None:
    """Fork ``home``, commit events on the fork, merge it back (a merge commit), delete it."""
    if _fork_with_events(c, tally, writer, home, world, key):
        merged = _timed(tally, "merge", lambda: c.merge_world(world, home, "NORMAL", idempotency_key=key + "-m"))
        if merged is not None and merged.status != "merged":
            tally.error("merge", RuntimeError(f"merge status {merged.status}, expected merged"))
    _timed(tally, "write", lambda: c.delete_world(world, idempotency_key=key + "-d"))


def _publish_cycle(c: WorldClient, tally: Tally, writer: Writer, home: str, world: str, key: str) -> None:
    """Fork ``home``, commit events on the fork, audit its publish into ``home``, approve, run it.

    The audit must be ``eligible`` (the fork holds new entities; ``home`` moves only by this client's
    own cycles), so the run fast-forwards ``home`` to the fork and deletes the fork. The run is sent
    twice with one key (the second answers from the stored outcome) and once with a new key (the
    gate answers ``done`` with the first run's commit): one publish either way.
    """
    if not _fork_with_events(c, tally, writer, home, world, key):
        _timed(tally, "write", lambda: c.delete_world(world, idempotency_key=key + "-d"))
        return
    plan = _timed(tally, "publish", lambda: c.publish_audit(world, home, idempotency_key=key + "-a"))
    if plan is not None and plan.verdict != "eligible":
        tally.error(
            "publish", RuntimeError(f"audit verdict {plan.verdict} ({list(plan.blocked_by)}), expected eligible")
        )
    elif plan is not None:
        pid = plan.plan_id
        _timed(tally, "publish", lambda: c.publish_approve(pid, home, idempotency_key=key + "-p"))
        runs = [_timed(tally, "publish", lambda: c.publish_run(pid, home, idempotency_key=key + "-x")) for _ in "ab"]
        again = _timed(tally, "publish", lambda: c.publish_run(pid, home, idempotency_key=key + "-y"))
        first = runs[0]
        if first is not None and (first.outcome != "published" or runs[1] != first):
            tally.error(
                "publish", RuntimeError(f"run {first.outcome}/{first.action}; retry differs: {runs[1] != first}")
            )
        if first is not None and again is not None and (again.action, again.commit_hash) != ("done", first.commit_hash):
            tally.error("publish", RuntimeError(f"a new key's run answered {again.action} {again.commit_hash[:12]}"))
    _timed(tally, "write", lambda: c.delete_world(world, idempotency_key=key + "-d"))


def _client_loop(
    server: ApiProcess, n: int, stop_at: float, run: str, tally: Tally, read_world: str, writer: Writer
) -> None:
    """80% reads; the writes are world create/release/delete, merge cycles and publish cycles in turn.

    Each client merges and publishes into its own home world (forked from prod at start), so the mix
    measures the server, not 50 clients racing for one target head (that race is refused by design).
    """
    rnd = random.Random(n)
    home = f"lt{run}-home{n}"
    with server.client("admin") as c:
        _timed(tally, "write", lambda: c.create_world(home, idempotency_key=f"lt-{run}-home{n}"))
        i = 0
        while time.monotonic() < stop_at:
            i += 1
            if rnd.random() < 0.8:
                op = rnd.choice(("GetWorld", "ListWorlds", "GetCommitHistory", "ListReleases", "QueryAt"))
                if op == "GetWorld":
                    _timed(tally, "read", lambda: c.get_world(read_world))
                elif op == "ListWorlds":
                    _timed(tally, "read", lambda: c.list_worlds())
                elif op == "GetCommitHistory":
                    _timed(tally, "read", lambda: list(c.history(read_world, limit=5)))
                elif op == "QueryAt":
                    _timed(
                        tally, "read", lambda: list(c.query_at(read_world, "person", f"s{rnd.randrange(SEED_EVENTS)}"))
                    )
                else:
                    _timed(tally, "read", lambda: c.list_releases(read_world))
                continue
            world = f"lt{run}-{n}-{i}"
            key = f"lt-{run}-{n}-{i}"
            cycle = rnd.choice(("worlds", "merge", "publish"))
            if cycle == "merge":
                _merge_cycle(c, tally, writer, home, world, key)
                continue
            if cycle == "publish":
                _publish_cycle(c, tally, writer, home, world, key)
                continue
            for _ in range(2):  # the retry must answer from the stored outcome, not act again
                _timed(tally, "write", lambda w=world, k=key: c.create_world(w, idempotency_key=k + "-c"))
            _timed(tally, "write", lambda w=world, k=key: c.create_release(w, "r1", idempotency_key=k + "-r"))
            _timed(tally, "write", lambda w=world, k=key: c.delete_world(w, idempotency_key=k + "-d"))


def run_load(settings: Settings, tmp: Path, clients: int, seconds: float) -> dict[str, object]:
    run = uuid.uuid4().hex[:6]
    nessie = SyncNessieClient.from_settings(settings)
    main = f"main-lt{run}"
    nessie.create_branch(main, Reference("main", "BRANCH", nessie.config().no_ancestor_hash))
    settings = settings.replace(
        main_branch=main,
        api_redis_prefix=f"causeway:api-lt{run}",
        api_idempotency_ttl_s=3600,
        publish_log_branch=f"publish-log-lt{run}",
        data_dir=str(tmp / "data"),
    )
    server = start_api(settings, tmp)
    tally = Tally()
    writers = [Writer(settings) for _ in range(clients)]
    load_before = os.getloadavg()
    published: Counter[str] = Counter()
    try:
        # committed events on prod, so every world forked from it holds tables and shares history; the
        # release name holds the run id: release tags are global in Nessie and the clean-up removes it
        writers[0].commit(settings.prod_world, f"lt{run}-seed", [f"s{j}" for j in range(SEED_EVENTS)])
        with server.client("admin") as c:
            c.create_release(settings.prod_world, f"lt{run}-base", idempotency_key=f"lt-{run}-base")
            c.create_world(f"lt{run}-read", idempotency_key=f"lt-{run}-read")
        stop_at = time.monotonic() + seconds
        threads = [
            threading.Thread(target=_client_loop, args=(server, n, stop_at, run, tally, f"lt{run}-read", writers[n]))
            for n in range(clients)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        load_after = os.getloadavg()
        log = PublishLog(nessie, settings.publish_log_branch, settings.commit_author)
        published.update(str(e["plan_id"]) for e in log.entries() if e["kind"] == "run" and e["outcome"] == "published")
    finally:
        server.stop()
        for w in writers:
            w.close()
        for ref in nessie.list_references():
            if run in ref.name:
                try:
                    nessie.delete_reference(ref.name, ref.hash, ref.type)
                except Exception:  # noqa: BLE001 - cleanup only
                    pass
        nessie.close()
    ran = Counter(str(e["idempotency_key"]) for e in server.audit() if not e["replayed"] and e["result"] == "OK")
    twice = {k: v for k, v in ran.items() if v > 1}
    total = sum(len(v) for v in tally.latencies.values())
    report: dict[str, object] = {
        "clients": clients,
        "seconds": round(elapsed, 1),
        "requests": total,
        "requests_per_s": round(total / elapsed, 1),
        "errors": dict(tally.errors),
        "error_examples": tally.examples,
        "actions_run": len(ran),
        "actions_run_twice": twice,
        "plans_published": len(published),
        "plans_published_twice": {k: v for k, v in published.items() if v > 1},
        "loadavg_before": load_before,
        "loadavg_after": load_after,
    }
    report["methods_ok"] = dict(Counter(str(e["method"]) for e in server.audit() if e["result"] == "OK"))
    for kind, values in sorted(tally.latencies.items()):
        q = statistics.quantiles(values, n=100) if len(values) > 1 else values * 99
        report[kind] = {"count": len(values), "p50_ms": round(q[49] * 1000, 1), "p99_ms": round(q[98] * 1000, 1)}
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", default="", help="Also write the JSON report here.")
    args = parser.parse_args()
    tmp = ROOT / ".causeway" / "run" / f"api-load-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True, exist_ok=True)
    report = run_load(Settings.from_env(), tmp, args.clients, args.seconds)
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
