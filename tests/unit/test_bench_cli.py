"""The benchmark's own command line: every subcommand's --help shows an example to copy."""

from __future__ import annotations

import pytest

from bench.__main__ import main


@pytest.mark.parametrize("cmd", ["run", "scale", "soak", "dedupe-memory"])
def test_every_bench_subcommand_help_shows_an_example(cmd: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([cmd, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "example" in out and f"python -m bench {cmd}" in out, out
