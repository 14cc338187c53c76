"""The world manager API over a real gRPC channel against a `causeway serve` process, Nessie and Redis."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from api import world_manager_pb2 as pb
from api.client import WorldClient
from bench.api_load import ApiProcess, start_api
from cli.main import cli
from streams.settings import Settings
from tests.integration import api_fixtures as afx
from tests.integration import worlds_fixtures as fx
from tests.integration.commits import link, obj
from tests.integration.worlds_fixtures import WrittenWorld
from worlds.api import Worlds

pytestmark = pytest.mark.integration
world_settings, wclient, written = fx.world_settings, fx.wclient, fx.written
api_settings, server = afx.api_settings, afx.server


def _three_batches(w: WrittenWorld) -> None:
    w.commit("b1", [obj(w.world, f"p{i}", "CREATE", 1, n=i) for i in range(5)] + [link(w.world, "l1", 1, "p0", "p1")])
    w.commit("b2", [obj(w.world, "p0", "UPDATE", 2, n=100), obj(w.world, "p1", "DELETE", 2)])
    w.commit("b3", [obj(w.world, "p9", "CREATE", 1, n=9)])


def _code(call) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()


def _details(call) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


def test_every_rpc_over_a_real_channel(server: ApiProcess, written: WrittenWorld, unique: str) -> None:
    _three_batches(written)
    w, heads = written.world, written.heads
    with server.client("admin") as c:
        assert c.get_world(w).head_hash == heads[-1]
        # pages of one world: a token resumes right after the page it came with
        one = c.call("ListWorlds", pb.ListWorldsRequest(page_size=1))
        two = c.call("ListWorlds", pb.ListWorldsRequest(page_size=1, page_token=one.next_page_token))
        assert len(one.worlds) == len(two.worlds) == 1 and one.worlds[0].world_id < two.worlds[0].world_id
        # every page token followed (pages of 200: the shared Nessie holds thousands of test branches,
        # and each page lists them all, so pages of one would make this test quadratic)
        ids = [x.world_id for x in c.list_worlds(page_size=200)]
        assert w in ids and ids == sorted(set(ids)) and ids[:2] == [one.worlds[0].world_id, two.worlds[0].world_id]

        # History streams pages of one commit; a page token resumes after the page it came with.
        pages = list(c.stream("GetCommitHistory", pb.CommitHistoryRequest(world_id=w, page_size=1, limit=3)))
        assert [p.commits[0].hash for p in pages] == heads[::-1]
        assert [p.commits[0].event_count for p in pages] == [1, 2, 6]
        assert pages[-1].next_page_token == ""
        resumed = list(c.history(w, page_token=pages[0].next_page_token, limit=3))
        assert [r.hash for r in resumed] == heads[1::-1]

        changes = list(c.diff(f"{w}@{heads[0]}", f"{w}@{heads[2]}", page_size=1))
        assert sorted((ch.pk, ch.change) for ch in changes) == [("p0", "modified"), ("p1", "removed"), ("p9", "added")]

        audit = list(c.audit(w, "person", "p0"))
        assert [(a.change_type, a.version) for a in audit] == [("CREATE", 1), ("UPDATE", 2)]
        assert all(a.commit_hash in heads for a in audit)

        at_first = list(c.query_at(f"{w}@{heads[0]}", page_size=2))
        objects = [json.loads(o) for p in at_first for o in p.objects_json]
        assert sorted(o["object_pk"] for o in objects) == [f"p{i}" for i in range(5)]
        assert {p.hash for p in at_first} == {heads[0]} and len(at_first) == 3  # 5 objects + 1 link, pages of 2

        rel = c.create_release(w, "v1", "first release")
        assert rel.created and rel.release.released_hash == heads[-1]
        assert [r.name for r in c.list_releases(w)] == ["v1"]

        created = c.create_world(f"c{unique}")
        assert created.created and created.world.branch == f"world-c{unique}"
        fork = c.fork_world(w, f"f{unique}", release="v1")
        assert fork.created and fork.world.head_hash == rel.release.hash

        rolled = c.rollback(w, f"{w}@{heads[0]}", expected_hash=rel.release.hash)
        assert not rolled.noop and rolled.commit_hash and rolled.target_hash == heads[0]
        now = [json.loads(o) for p in c.query_at(w, entity_type="person") for o in p.objects_json]
        assert sorted(o["object_pk"] for o in now) == [f"p{i}" for i in range(5)]

        assert c.delete_world(f"c{unique}") is True
        assert _code(lambda: c.get_world(f"c{unique}")) == grpc.StatusCode.NOT_FOUND
        # MergeWorld is implemented now (tests/integration/test_api_merge_publish.py): a self-merge is bad input.
        code, details = _details(lambda: c.merge_world(w, w))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "same world" in details

    with grpc.insecure_channel(server.target) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        status = health.Check(health_pb2.HealthCheckRequest(service="causeway.worlds.v1.WorldManagerService"))
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        refl = reflection_pb2_grpc.ServerReflectionStub(ch)
        answer = next(iter(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))))
        names = {s.name for s in answer.list_services_response.service}
        assert {"causeway.worlds.v1.WorldManagerService", "grpc.health.v1.Health"} <= names


def test_errors_map_to_status_codes(server: ApiProcess, written: WrittenWorld) -> None:
    _three_batches(written)
    w = written.world
    with server.client("admin") as c:
        assert _code(lambda: c.get_world("Bad World!")) == grpc.StatusCode.INVALID_ARGUMENT
        assert _code(lambda: c.get_world("no-such-world-x1")) == grpc.StatusCode.NOT_FOUND
        assert _code(lambda: list(c.history("no-such-world-x1"))) == grpc.StatusCode.NOT_FOUND
        assert _code(lambda: list(c.diff(f"{w}@deadbeef00", w))) == grpc.StatusCode.NOT_FOUND
        moved = lambda: c.delete_world(w, expected_hash=written.heads[0])  # noqa: E731
        assert _code(moved) == grpc.StatusCode.FAILED_PRECONDITION
        assert c.get_world(w).head_hash == written.heads[-1]  # refused: nothing deleted
        c.create_release(w, "v1")
        written.commit("b4", [obj(w, "p7", "CREATE", 1, n=7)])
        assert _code(lambda: c.create_release(w, "v1")) == grpc.StatusCode.ALREADY_EXISTS
        no_key = lambda: c.call("CreateWorld", pb.CreateWorldRequest(world_id="x"))  # noqa: E731
        assert _code(no_key) == grpc.StatusCode.INVALID_ARGUMENT
        bad_token = lambda: c.call("ListWorlds", pb.ListWorldsRequest(page_token="not-a-token"))  # noqa: E731
        assert _code(bad_token) == grpc.StatusCode.INVALID_ARGUMENT


def test_each_auth_outcome_and_the_audit_log(server: ApiProcess, written: WrittenWorld, unique: str) -> None:
    _three_batches(written)
    w, missing = written.world, f"missing{unique}"
    prod = server.settings.prod_world

    def create(client, world):  # type: ignore[no-untyped-def]
        return lambda: client.create_release(world, "r1")

    for token in ("", "cwy_wrong-token"):
        with server.client(token=token) as anon:
            # Same answer for a world that exists and one that does not: nothing is revealed.
            got = {_details(lambda a=anon, x=x: a.get_world(x)) for x in (w, missing)}
            assert len(got) == 1 and next(iter(got))[0] == grpc.StatusCode.UNAUTHENTICATED
            assert _code(create(anon, w)) == grpc.StatusCode.UNAUTHENTICATED
    with server.client("reader") as reader:
        assert reader.get_world(w).head_hash == written.heads[-1]
        assert len(list(reader.history(w))) == 3
        denied = {_details(create(reader, x)) for x in (w, missing)}
        assert {d[0] for d in denied} == {grpc.StatusCode.PERMISSION_DENIED}
        assert all("does not exist" not in d[1] for d in denied)
    with server.client("operator") as op:
        assert op.create_release(w, "r1").created
        assert _code(create(op, prod)) == grpc.StatusCode.PERMISSION_DENIED  # prod needs admin
        assert _code(lambda: op.delete_world(w)) == grpc.StatusCode.PERMISSION_DENIED
        assert _code(lambda: op.delete_world(missing)) == grpc.StatusCode.PERMISSION_DENIED
    with server.client("admin") as admin:
        assert admin.create_release(prod, f"r{unique}").created  # release tags are global: unique name
        assert admin.delete_world(w) is True

    audit = server.audit()
    by = {(e["who"], e["method"], e["world"], e["result"]) for e in audit}
    assert ("test-operator", "CreateRelease", w, "OK") in by
    assert ("test-reader", "CreateRelease", missing, "PERMISSION_DENIED") in by
    assert ("-", "CreateRelease", w, "UNAUTHENTICATED") in by
    assert ("test-admin", "DeleteWorld", w, "OK") in by
    assert all(e["method"] not in ("GetWorld", "GetCommitHistory") for e in audit)  # reads are not audited
    written_out = Path(server.settings.api_audit_log).read_text() + server.log.read_text()
    for token in server.tokens.values():
        assert token not in written_out


def _release_commits(server: ApiProcess, world: str) -> int:
    with server.client("admin") as c:
        return sum(1 for r in c.history(world) if r.kind == "release")


def test_same_key_twice_and_reused_with_other_parameters(server: ApiProcess, unique: str) -> None:
    with server.client("operator") as c:
        first = c.create_world(f"i{unique}", idempotency_key=f"k-{unique}")
        again = c.create_world(f"i{unique}", idempotency_key=f"k-{unique}")
        # A second *run* would answer created=False; the stored outcome of the first says True.
        assert first.created and again == first
        fresh = c.create_world(f"i{unique}", idempotency_key=f"k2-{unique}")
        assert not fresh.created
        code, details = _details(lambda: c.create_world(f"other{unique}", idempotency_key=f"k-{unique}"))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "different request" in details
        assert _code(lambda: c.get_world(f"other{unique}")) == grpc.StatusCode.NOT_FOUND
    runs = [e for e in server.audit() if e["idempotency_key"] == f"k-{unique}"]
    assert [(e["result"], e["replayed"]) for e in runs] == [("OK", False), ("OK", True), ("INVALID_ARGUMENT", False)]


def test_same_key_concurrently_from_two_clients_has_one_effect(server: ApiProcess, written: WrittenWorld) -> None:
    _three_batches(written)
    w = written.world
    barrier = threading.Barrier(2)
    answers: list[pb.ReleaseResponse] = []

    def call() -> None:
        with server.client("operator") as c:
            barrier.wait()
            answers.append(c.create_release(w, "v1", idempotency_key="same-key"))

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 2 and answers[0] == answers[1] and answers[0].created
    assert _release_commits(server, w) == 1
    runs = [e for e in server.audit() if e["idempotency_key"] == "same-key"]
    assert sorted(e["replayed"] for e in runs) == [False, True]


def test_server_killed_mid_action_then_retry_has_one_effect(
    api_settings: Settings, written: WrittenWorld, tmp_path: Path
) -> None:
    _three_batches(written)
    w = written.world
    doomed = start_api(api_settings, tmp_path, fault="api-after-action:1")
    with doomed.client("operator") as c:
        assert _code(lambda: c.create_release(w, "v1", idempotency_key="crash-key")) == grpc.StatusCode.UNAVAILABLE
    doomed.proc.wait(timeout=30)
    assert doomed.proc.returncode == -9
    assert _release_commits_direct(written) == 1  # the effect landed before the kill, the outcome was not stored

    again = start_api(api_settings, tmp_path, tokens=doomed.tokens)
    try:
        with again.client("operator") as c:
            # The dead holder's lease expires; the retry runs the action, which finds the release made.
            answer = c.create_release(w, "v1", idempotency_key="crash-key")
            assert answer.release.released_hash == written.heads[-1] and not answer.created
            assert c.create_release(w, "v1", idempotency_key="crash-key") == answer  # now stored
        assert _release_commits(again, w) == 1
    finally:
        again.stop()


def _release_commits_direct(written: WrittenWorld) -> int:
    return sum(
        1
        for page in written.client.history(written.branch)
        for e in page
        if "causeway.release" in " ".join(e.properties)
    )


def test_tls_when_a_certificate_is_configured(api_settings: Settings, tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert)]
        + ["-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        check=True,
        capture_output=True,
    )
    secure = api_settings.replace(api_tls_cert=str(cert), api_tls_key=str(key))
    proc = start_api(secure, tmp_path)  # its readiness probe already speaks TLS with the cert as CA
    try:
        with proc.client("reader") as c:
            assert [w.world_id for w in c.list_worlds()]  # the prod world at least
        with WorldClient(proc.target, proc.tokens["reader"]) as plain:
            assert _code(lambda: plain.list_worlds()) == grpc.StatusCode.UNAVAILABLE
    finally:
        proc.stop()


def test_cli_world_commands_use_the_api_when_its_url_is_set(server: ApiProcess, unique: str) -> None:
    # The CLI reads its settings from the environment; the API server holds the Nessie settings.
    env = {"CAUSEWAY_API_URL": server.target, "CAUSEWAY_API_TOKEN": server.tokens["admin"]}
    runner = CliRunner()
    made = runner.invoke(cli, ["worlds", "create", f"cli{unique}"], env=env)
    assert made.exit_code == 0 and f"created world cli{unique}" in made.output, made.output
    listed = runner.invoke(cli, ["worlds", "list", "--json"], env=env)
    assert f"cli{unique}" in {json.loads(line)["world"] for line in listed.output.splitlines()}
    gone = runner.invoke(cli, ["worlds", "delete", f"cli{unique}", "--yes"], env=env)
    assert gone.exit_code == 0 and f"deleted world cli{unique}" in gone.output, gone.output
    audit = {(e["who"], e["method"], e["world"]) for e in server.audit()}
    assert {("test-admin", "CreateWorld", f"cli{unique}"), ("test-admin", "DeleteWorld", f"cli{unique}")} <= audit
    reader = dict(env, CAUSEWAY_API_TOKEN=server.tokens["reader"])
    denied = runner.invoke(cli, ["worlds", "create", f"cli2{unique}"], env=reader)
    assert denied.exit_code == 1 and "PERMISSION_DENIED" in denied.output and "Traceback" not in denied.output


def test_streams_abandoned_by_their_clients_do_not_starve_the_server(server: ApiProcess, written: WrittenWorld) -> None:
    w = written.world
    written.commit("b1", [obj(w, f"p{i:02d}", "CREATE", 1, n=i) for i in range(12)])
    with server.client("reader") as c:
        for _ in range(10):  # more than the server's worker threads
            stream = c.stream("QueryAt", pb.QueryAtRequest(ref=w, page_size=1))
            assert len(next(stream).objects_json) == 1
            stream.cancel()  # the client goes away with 11 pages unread
    with WorldClient(server.target, server.tokens["operator"], timeout_s=60) as c:
        assert c.create_release(w, "after").created  # a blocking call still gets a worker thread
        assert len([o for p in c.query_at(w) for o in p.objects_json]) == 12


def test_delete_release_is_admin_only_idempotent_and_audited(server: ApiProcess, written: WrittenWorld) -> None:
    _three_batches(written)
    w = written.world
    with server.client("operator") as op, server.client("admin") as admin:
        made = op.create_release(w, "v1").release
        for who in (op, server.client("reader")):
            assert _code(lambda c=who: c.delete_release(w, "v1")) == grpc.StatusCode.PERMISSION_DENIED
        first = admin.delete_release(w, "v1", idempotency_key="del-k")
        assert first.deleted and first.release == made
        assert admin.delete_release(w, "v1", idempotency_key="del-k") == first  # stored: one effect
        assert admin.delete_release(w, "v1").deleted is False  # a new key: nothing left to delete
        assert [r.name for r in admin.list_releases(w)] == []
        assert _code(lambda: admin.delete_release(w, "bad name!")) == grpc.StatusCode.INVALID_ARGUMENT
    runs = [(e["who"], e["result"], e["replayed"]) for e in server.audit() if e["idempotency_key"] == "del-k"]
    assert runs == [("test-admin", "OK", False), ("test-admin", "OK", True)]
    assert ("test-operator", "DeleteRelease", "PERMISSION_DENIED") in {
        (e["who"], e["method"], e["result"]) for e in server.audit()
    }


def test_server_killed_mid_release_delete_then_retry_has_one_effect(
    api_settings: Settings, written: WrittenWorld, tmp_path: Path
) -> None:
    _three_batches(written)
    w = written.world
    with Worlds(api_settings, written.client) as direct:
        direct.create_release(w, "v1")
    doomed = start_api(api_settings, tmp_path, fault="api-after-action:1")
    with doomed.client("admin") as c:
        lost = lambda: c.delete_release(w, "v1", idempotency_key="del-crash")  # noqa: E731
        assert _code(lost) == grpc.StatusCode.UNAVAILABLE  # killed after the delete, before storing the outcome
    doomed.proc.wait(timeout=30)
    assert doomed.proc.returncode == -9
    last = start_api(api_settings, tmp_path, tokens=doomed.tokens)
    try:
        with last.client("admin") as c:
            assert c.list_releases(w) == []  # the delete landed before the kill
            # the dead holder's lease expires; the retry runs again and finds the release gone: no error
            retry = c.delete_release(w, "v1", idempotency_key="del-crash")
            assert retry.deleted is False
            assert c.delete_release(w, "v1", idempotency_key="del-crash") == retry  # now stored
    finally:
        last.stop()
