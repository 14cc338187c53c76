"""The operator commands' shared options: counts and durations never below zero, defaults shown."""

from __future__ import annotations

import click
from click.testing import CliRunner

from cli.main import cli
from cli.options import not_negative


@click.command()
@not_negative("--limit", default=50, help="At most this many.")
@not_negative("--wait", default=5.0, help="Seconds.")
def probe(limit: int, wait: float) -> None:
    click.echo(f"{limit!r} {wait!r}")


def test_a_count_and_a_duration_keep_their_types_and_refuse_negatives() -> None:
    assert CliRunner().invoke(probe, []).output == "50 5.0\n"
    assert CliRunner().invoke(probe, ["--limit", "0", "--wait", "0.5"]).output == "0 0.5\n"
    for args in (["--limit", "-1"], ["--wait", "-0.1"], ["--limit", "1.5"]):
        out = CliRunner().invoke(probe, args)
        assert out.exit_code == 2 and "Invalid value" in out.output


def test_dlq_and_replay_show_the_defaults_of_their_shared_options() -> None:
    for args, shown in (
        (["dlq", "list", "--help"], "[default: 50; x>=0]"),
        (["dlq", "redrive", "--help"], "[default: 20; x>=0]"),
        (["replay", "--help"], "[default: 5.0; x>=0]"),
    ):
        out = CliRunner().invoke(cli, args)
        assert out.exit_code == 0 and shown in " ".join(out.output.split()), out.output
