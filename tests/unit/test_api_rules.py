"""Pure parts of the API: roles, token file, page tokens, error mapping, saga validation and compensation."""

from __future__ import annotations

import json

import grpc
import pytest

from api import paging
from api import world_manager_pb2 as pb
from api.auth import (
    METHOD_ROLE,
    Principal,
    Role,
    TokenFileError,
    authenticate,
    authorize,
    bearer,
    hash_token,
    parse_tokens,
    token_line,
)
from api.errors import InvalidRequest, PermissionDenied, Unauthenticated, status_for
from api.saga import SagaRefused, check_schema, compensation, compensations, undo_id, validate_events
from models.events import ChangeType, EntityKind
from models.schema import Property, PropType, TypeSchema
from sinks.errors import NessieConflict, NessieNotFound, NessieUnavailable
from worlds.errors import InvalidWorldRequest, WorldExists, WorldMoved, WorldNotFound, WorldsError
from worlds.manager import DeleteMoved, ForkSourceNotFound, WorldError


def test_token_file_stores_hashes_and_authenticates_by_them() -> None:
    text = "# callers\n" + token_line("bot", Role.operator, "secret-1") + "\n\n"
    tokens = parse_tokens(text)
    assert "secret-1" not in text and hash_token("secret-1") in text
    assert authenticate(tokens, "secret-1") == Principal("bot", Role.operator)
    with pytest.raises(Unauthenticated):
        authenticate(tokens, "secret-2")
    with pytest.raises(Unauthenticated):
        authenticate(tokens, None)
    with pytest.raises(TokenFileError, match="line 1"):
        parse_tokens("bot superuser abc")


def test_bearer_header_is_read_case_insensitively() -> None:
    assert bearer((("Authorization", "Bearer tok"),)) == "tok"
    assert bearer((("authorization", b"bearer  tok2"),)) == "tok2"
    assert bearer((("authorization", "Basic x"),)) is None and bearer(None) is None


@pytest.mark.parametrize(
    ("role", "method", "world", "allowed"),
    [
        (Role.reader, "GetWorld", "prod", True),
        (Role.reader, "CreateWorld", "w1", False),
        (Role.operator, "CreateRelease", "w1", True),
        (Role.operator, "CreateRelease", "prod", False),
        (Role.operator, "DeleteWorld", "w1", False),
        (Role.admin, "DeleteWorld", "w1", True),
        (Role.admin, "Rollback", "prod", True),
        (Role.operator, "SomethingNew", None, False),
    ],
)
def test_roles(role: Role, method: str, world: str | None, allowed: bool) -> None:
    p = Principal("x", role)
    if allowed:
        authorize(p, method, world, "prod")
    else:
        with pytest.raises(PermissionDenied):
            authorize(p, method, world, "prod")


def test_page_tokens_round_trip_and_refuse_other_listings() -> None:
    token = paging.encode("diff", a="w@1", off=10)
    assert paging.decode(token, "diff") == {"kind": "diff", "a": "w@1", "off": 10}
    assert paging.decode("", "diff") is None
    with pytest.raises(InvalidRequest):
        paging.decode(token, "audit")
    with pytest.raises(InvalidRequest):
        paging.decode("%%%", "diff")
    assert paging.page_size(0) == paging.DEFAULT_PAGE and paging.page_size(10**6) == paging.MAX_PAGE
    assert list(paging.chunks(range(5), 2)) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (WorldNotFound("world 'x' does not exist (no branch world-x)"), grpc.StatusCode.NOT_FOUND),
        (InvalidWorldRequest("invalid world id 'X!': use lower-case letters"), grpc.StatusCode.INVALID_ARGUMENT),
        (WorldExists("release x/y exists at ab; releases are immutable"), grpc.StatusCode.ALREADY_EXISTS),
        (WorldMoved("world 'x' moved during the rollback"), grpc.StatusCode.FAILED_PRECONDITION),
        (ForkSourceNotFound("fork source tag t does not exist"), grpc.StatusCode.NOT_FOUND),
        (DeleteMoved("world 'x' moved while deleting"), grpc.StatusCode.FAILED_PRECONDITION),
        (
            WorldError("world 'prod' is the production world (main); it cannot be deleted"),
            grpc.StatusCode.FAILED_PRECONDITION,
        ),
        # By type only: the words of a message decide nothing.
        (WorldsError("release x/y does not exist"), grpc.StatusCode.FAILED_PRECONDITION),
        (WorldNotFound("releases are immutable"), grpc.StatusCode.NOT_FOUND),
    ],
)
def test_worlds_errors_map_to_status_codes_by_type(error: Exception, code: grpc.StatusCode) -> None:
    assert status_for(error) == (code, str(error))


def test_worlds_refusals_raised_by_the_code_map_to_status_codes() -> None:
    """The worlds API's own raise sites for refs and world ids (pure: no Nessie call)."""
    from worlds.base import _parse

    for bad in ("x@", "Bad!", "w@not-a-time-zz"):
        with pytest.raises(WorldsError) as info:
            _parse(bad)
        assert status_for(info.value)[0] == grpc.StatusCode.INVALID_ARGUMENT, bad


def test_errors_map_to_status_codes() -> None:
    assert status_for(NessieConflict("hash"))[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert status_for(NessieNotFound("ref"))[0] == grpc.StatusCode.NOT_FOUND
    assert status_for(NessieUnavailable("down"))[0] == grpc.StatusCode.UNAVAILABLE
    code, message = status_for(RuntimeError("secret internals"))
    assert code == grpc.StatusCode.INTERNAL and "secret internals" not in message


def _ev(pk: str, change: str, version: int, before: dict | None = None, world: str = "w1", **after: object) -> str:
    doc = {
        "event_id": f"{pk}-{change}-{version}",
        "world_id": world,
        "object_type": "person",
        "object_pk": pk,
        "change_type": change,
        "before_properties": before,
        "after_properties": dict(after) if change != "DELETE" else None,
        "version": version,
        "occurred_at": 1,
    }
    return json.dumps(doc)


def test_saga_validation_lists_every_bad_event() -> None:
    with pytest.raises(SagaRefused) as info:
        validate_events(
            "w1",
            [_ev("a", "CREATE", 1, n=1), _ev("b", "CREATE", 1, world="w2", n=1), _ev("c", "DELETE", 2), "{}"],
            {},
            1 << 20,
        )
    reasons = info.value.reasons
    assert [r.split(" ")[1].rstrip(":") for r in reasons] == ["1", "2", "3"]
    assert "before_properties" in reasons[1]
    assert len(validate_events("w1", [_ev("a", "CREATE", 1, n=1)], {}, 1 << 20)) == 1


def test_saga_checks_the_registered_schema() -> None:
    schema = TypeSchema(EntityKind.OBJECT, "person", 1, (Property("p1", "n", PropType.parse("int")),))
    ok, bad = (
        validate_events("w1", [e], {}, 1 << 20)[0] for e in (_ev("a", "CREATE", 1, n=1), _ev("a", "CREATE", 1, m=1))
    )
    assert check_schema(ok, schema) is None and check_schema(ok, None) is None
    assert "'m'" in (check_schema(bad, schema) or "")


def test_compensations_undo_in_reverse_and_wait_for_their_event() -> None:
    events = validate_events(
        "w1",
        [_ev("a", "CREATE", 1, n=1), _ev("a", "UPDATE", 2, {"n": 1}, n=2), _ev("b", "DELETE", 3, {"n": 5})],
        {},
        1 << 20,
    )
    undo = compensations(events, now_ms=7)
    assert [(u.entity_pk, u.change_type, u.version, u.before, u.after) for u in undo] == [
        ("b", ChangeType.CREATE, 4, None, {"n": 5}),
        ("a", ChangeType.UPDATE, 3, {"n": 2}, {"n": 1}),
        ("a", ChangeType.DELETE, 2, {"n": 1}, None),
    ]
    assert [u.caused_by for u in undo] == [e.event_id for e in reversed(events)]
    assert compensation(events[0]).event_id == undo_id(events[0].event_id) == undo[-1].event_id


def test_api_token_command_appends_a_hash_and_prints_the_token_once(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from cli.main import cli

    file = tmp_path / "tokens"
    runner = CliRunner()
    out = runner.invoke(cli, ["api-token", "ops", "--role", "operator", "--file", str(file)])
    assert out.exit_code == 0, out.output
    token = out.output.strip()
    assert token.startswith("cwy_") and token not in file.read_text()
    assert authenticate(parse_tokens(file.read_text()), token) == Principal("ops", Role.operator)
    again = runner.invoke(cli, ["api-token", "ops", "--file", str(file)])
    assert again.exit_code == 1 and "already has a token named 'ops'" in again.output
    assert oct(file.stat().st_mode & 0o777) == "0o600"


def test_every_rpc_of_the_service_has_a_role() -> None:
    """A new RPC without an entry would fall back to admin silently: each one is listed on purpose."""
    service = pb.DESCRIPTOR.services_by_name["WorldManagerService"]
    assert set(service.methods_by_name) == set(METHOD_ROLE)
