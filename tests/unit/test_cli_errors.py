"""CLI failures become one line and a documented exit code (cli.errors, cli.main.needs)."""

from __future__ import annotations

import click
import pytest
from aiokafka.errors import KafkaConnectionError
from click.testing import CliRunner
from redis.exceptions import ConnectionError as RedisConnectionError

from cli.errors import Exit, Guarded, explain, mask_url
from cli.main import cli, needs
from sinks.errors import NessieNotAnApi, NessieNotFound, NessieUnavailable, error_from_response
from streams.settings import Settings
from worlds.manager import WorldError

S = Settings(redis_url="redis://user:s3cret@10.0.0.1:6379/0", nessie_url="http://n:19120/api/v2")


def test_mask_url_hides_passwords_only() -> None:
    assert mask_url("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert mask_url("redis://:s3cret@h:6379/0") == "redis://:***@h:6379/0"
    assert mask_url("http://h:19120/api/v2") == "http://h:19120/api/v2"


def test_a_404_without_nessies_error_body_is_not_not_found() -> None:
    # Another server's 404 page (e.g. Prometheus at the Nessie URL) must never read as "no such world".
    err = error_from_response(404, b"404 page not found\n")
    assert isinstance(err, NessieNotAnApi) and not isinstance(err, NessieNotFound)
    real = error_from_response(404, b'{"message": "Named reference x not found", "errorCode": "REFERENCE_NOT_FOUND"}')
    assert isinstance(real, NessieNotFound)


@pytest.mark.parametrize(
    ("exc", "code", "words"),
    [
        (NessieUnavailable("Nessie unreachable: ConnectError"), Exit.UNAVAILABLE, ["Nessie", "http://n:19120/api/v2"]),
        (NessieNotAnApi("HTTP 404"), Exit.UNAVAILABLE, ["CAUSEWAY_NESSIE_URL"]),
        (KafkaConnectionError("Unable to bootstrap"), Exit.UNAVAILABLE, ["Kafka", "CAUSEWAY_KAFKA_BOOTSTRAP"]),
        (RedisConnectionError("Error 111"), Exit.UNAVAILABLE, ["Redis", "redis://user:***@10.0.0.1:6379/0"]),
        (WorldError("world x does not exist"), Exit.ERROR, ["world x does not exist"]),
    ],
)
def test_expected_failures_are_explained(exc: Exception, code: Exit, words: list[str]) -> None:
    line, got = explain(exc, S)
    assert got == code
    assert "\n" not in line and "s3cret" not in line
    for w in words:
        assert w in line


def test_a_wrapped_cause_is_found() -> None:
    try:
        try:
            raise RedisConnectionError("Error 111 connecting")
        except RedisConnectionError as inner:
            raise RuntimeError("replay failed") from inner
    except RuntimeError as outer:
        assert explain(outer, S)[1] == Exit.UNAVAILABLE


def test_guarded_group_turns_exceptions_into_one_line_and_an_exit_code() -> None:
    @click.group(cls=Guarded)
    def root() -> None:
        pass

    @root.command()
    def down() -> None:
        raise KafkaConnectionError("Unable to bootstrap from [('127.0.0.1', 1)]")

    @root.command()
    def bug() -> None:
        raise ZeroDivisionError("oops")

    r = CliRunner().invoke(root, ["down"])
    assert r.exit_code == Exit.UNAVAILABLE and "Traceback" not in r.output
    assert r.output.count("\n") == 1 and r.output.startswith("Error: Kafka unavailable at")
    r = CliRunner().invoke(root, ["bug"])
    assert r.exit_code == Exit.ERROR and "unexpected ZeroDivisionError: oops" in r.output


def test_every_command_that_touches_a_service_checks_it_first() -> None:
    assert needs(("worlds", "list")) == ("nessie",)
    assert needs(("worlds", "history")) == ("nessie",)  # a new subcommand inherits its group's needs
    assert needs(("dlq", "list")) == ("kafka",)
    assert needs(("dlq", "redrive")) == ("kafka", "redis", "nessie")
    assert needs(("replay",)) == ("kafka", "redis", "nessie")
    assert needs(("config",)) == ()


@pytest.mark.parametrize(
    "args",
    [
        ["dlq", "list", "--limit", "-3"],
        ["dlq", "redrive", "--all", "--show", "-1"],
        ["replay", "--max-records", "0"],
        ["replay", "--wait-parked", "-1"],
        ["worlds", "create", "w1", "--from-commit", "zzzz"],
    ],
)
def test_bad_options_are_a_usage_error_before_any_service_is_asked(args: list[str]) -> None:
    # The services point at a closed port: a usage error must win (exit 2), not "unavailable" (4).
    env = {"CAUSEWAY_KAFKA_BOOTSTRAP": "127.0.0.1:1", "CAUSEWAY_NESSIE_URL": "http://127.0.0.1:1/api/v2"}
    r = CliRunner().invoke(cli, args, env=env)
    assert r.exit_code == Exit.USAGE, r.output
    assert "Traceback" not in r.output


def test_cli_log_lines_carry_no_traceback() -> None:
    import logging

    from cli.errors import OneLineFormatter

    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        import sys

        record = logging.LogRecord("agents.reconcile", logging.ERROR, __file__, 1, "pass failed", None, sys.exc_info())
    line = OneLineFormatter("%(levelname)s %(name)s: %(message)s").format(record)
    assert line == "ERROR agents.reconcile: pass failed (ValueError: boom second line)"
    assert record.exc_info is not None  # other handlers still see the exception


def test_ctrl_c_in_any_command_exits_130_not_as_a_failure() -> None:
    @click.group(cls=Guarded)
    def root() -> None:
        pass

    @root.command()
    def slow() -> None:
        raise KeyboardInterrupt

    r = CliRunner().invoke(root, ["slow"])
    assert r.exit_code == Exit.INTERRUPTED, r.output
    assert "Error: interrupted" in r.output and "Aborted" not in r.output


def test_ctrl_c_of_a_replay_before_its_plan_exits_130_saying_nothing_was_done(monkeypatch: pytest.MonkeyPatch) -> None:
    import cli.replay

    async def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    async def no_report(*_: object) -> None:
        return None

    monkeypatch.setattr(cli.replay, "run_replay", interrupted)
    monkeypatch.setattr(cli.replay, "_interrupted_report", no_report)
    monkeypatch.setattr(cli.replay.CheckpointStore, "from_settings", staticmethod(lambda _s: _Store()))
    r = CliRunner().invoke(cli.replay.replay, ["--topic", "onto.changes.objects"], obj=Settings())
    assert r.exit_code == Exit.INTERRUPTED, r.output
    assert "interrupted before the replay was planned; nothing was done" in r.output


class _Store:
    async def close(self) -> None:
        return None


def test_a_table_whose_files_are_missing_names_the_file_and_the_warehouse() -> None:
    from sinks.errors import TableUnreadable

    exc = TableUnreadable("world demo-1 on world-demo-1: file missing: /old/wh/x.avro", path="/old/wh/x.avro")
    assert explain(RuntimeError("read failed"), S) is None
    line, code = explain(exc, Settings(warehouse="file:///new/wh")) or ("", None)
    assert code == Exit.ERROR
    assert "world demo-1" in line and "/old/wh/x.avro" in line and "file:///new/wh" in line
    assert "CAUSEWAY_WAREHOUSE" in line
