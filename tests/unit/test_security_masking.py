"""Credentials in URLs and settings never reach output: config, error lines, client reprs, bench files."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner

from streams.settings import SecretUrl, Settings, mask_url

PW = "pw-9f8e7d6c5b4a"
NESSIE = f"https://alice:{PW}@nessie.example.com/api/v2"


def test_the_project_has_one_url_masking_function() -> None:
    import cli.errors

    assert cli.errors.mask_url is mask_url
    # A token placed as the user part (https://<token>@host) is masked too, not only user:password.
    assert mask_url(f"https://{PW}@nessie.example.com/api/v2") == "https://***@nessie.example.com/api/v2"
    assert mask_url("http://127.0.0.1:19120/api/v2") == "http://127.0.0.1:19120/api/v2"


def test_config_masks_credentials_in_the_nessie_url() -> None:
    from cli.main import cli

    result = CliRunner().invoke(cli, ["config"], env={"CAUSEWAY_NESSIE_URL": NESSIE})
    assert result.exit_code == 0, result.output
    assert "https://alice:***@nessie.example.com/api/v2" in result.output
    assert PW not in result.output


def test_nessie_url_prints_masked_but_clients_get_the_real_one() -> None:
    from sinks.nessie import NessieClient

    s = Settings.from_env({"CAUSEWAY_NESSIE_URL": NESSIE})
    assert PW not in f"Nessie at {s.nessie_url}: refused" and PW not in repr(s)
    assert s.nessie_url.reveal() == NESSIE
    client = NessieClient.from_settings(s)
    assert client.base_url == NESSIE  # the HTTP client still authenticates with it
    assert PW not in repr(client)


def test_settings_given_plain_strings_still_mask_them() -> None:
    s = Settings(redis_url=f"redis://:{PW}@h:6379/0", nessie_url=NESSIE)
    assert type(s.redis_url) is SecretUrl and type(s.nessie_url) is SecretUrl
    assert PW not in f"{s.redis_url} {s.nessie_url} {s!r}"
    assert s.replace(nessie_url=NESSIE).nessie_url.reveal() == NESSIE


def test_error_lines_about_nessie_mask_the_url() -> None:
    from cli.errors import explain
    from sinks.errors import NessieAuthError, NessieUnavailable

    s = Settings.from_env({"CAUSEWAY_NESSIE_URL": NESSIE})
    for exc in (NessieAuthError("401 unauthorized"), NessieUnavailable("connect failed")):
        known = explain(exc, s)
        assert known is not None and "alice:***@nessie.example.com" in known[0] and PW not in known[0]


def test_preflight_names_refused_credentials_not_a_wrong_url() -> None:
    """A Nessie that answers 401 is Nessie: the line says the credentials were refused."""
    from agents.probes import ProbeResult
    from cli.preflight import failure_line

    s = Settings.from_env({"CAUSEWAY_NESSIE_URL": NESSIE})
    detail = "Nessie refused the credentials (401): wrong, expired or missing token (NessieAuthError: 401)"
    line = failure_line(s, ProbeResult("nessie", "wrong", detail, 0.1))
    assert "refused" in line and "something else answers" not in line and "is not Nessie" not in line
    assert PW not in line
    # aiokafka reports a refused password as a failed bootstrap ("down"): the refusal is named all the same.
    kafka = "authentication failed: wrong user name or password (KafkaConnectionError: Unable to bootstrap)"
    assert "Kafka at 127.0.0.1:9092 refused the connection" in failure_line(s, ProbeResult("kafka", "down", kafka, 1))
    down = failure_line(s, ProbeResult("kafka", "down", "KafkaConnectionError: Unable to bootstrap", 1))
    assert "Kafka unavailable at" in down
    # A URL that answers as something else keeps its own line.
    other = failure_line(s, ProbeResult("nessie", "wrong", "HTTP 404 without a Nessie error body", 0.1))
    assert "is not Nessie" in other


def test_contender_config_file_holds_no_password(tmp_path: Path) -> None:
    from bench.contender import ContenderConfig

    cfg = ContenderConfig(
        name="naive",
        bootstrap="127.0.0.1:9092",
        topics=["o", "l"],
        group="g",
        branches={"prod": "main"},
        warehouse="file:///tmp/w",
        stats_path=str(tmp_path / "s.json"),
        redis_url=SecretUrl(f"rediss://app:{PW}@redis.example.com:6380/0"),
    )
    path = tmp_path / "naive-0.json"
    cfg.dump(path)
    text = path.read_text()
    assert PW not in text
    assert json.loads(text)["redis_url"] == "rediss://app:***@redis.example.com:6380/0"
    assert ContenderConfig.load(str(path)).group == "g"


def test_bench_result_files_hold_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever ends up in a result document, no secret value of the run's settings is written."""
    import bench.report
    from bench.harness import save

    monkeypatch.setenv("CAUSEWAY_REDIS_PASSWORD", PW)
    monkeypatch.setenv("CAUSEWAY_NESSIE_URL", NESSIE)
    monkeypatch.setattr(bench.report, "markdown", lambda doc: json.dumps(doc))
    doc = {"run": {"started": "2026-11-30T10:00:00", "profile": {"name": "smoke"}, "id": "x", "cmd": f"-p {PW}"}}
    paths = save(doc, tmp_path)
    for path in paths:
        text = path.read_text()
        assert PW not in text and "***" in text, path


def test_one_line_log_format_masks_secrets_in_an_exception(caplog: pytest.LogCaptureFixture) -> None:
    """The CLI's one-line formatter appends ``(Type: message)``: that text is redacted too."""
    from cli.errors import OneLineFormatter
    from streams.security import install_log_redaction

    previous = logging.getLogRecordFactory()
    install_log_redaction(Settings.from_env({"CAUSEWAY_REDIS_PASSWORD": PW}))
    try:
        with caplog.at_level(logging.ERROR, logger="test.masking.oneline"):
            try:
                raise ConnectionError(f"AUTH failed for password {PW}")
            except ConnectionError:
                logging.getLogger("test.masking.oneline").exception("redis check failed")
    finally:
        logging.setLogRecordFactory(previous)
    line = OneLineFormatter("%(levelname)s %(message)s").format(caplog.records[-1])
    assert "ConnectionError" in line and "***" in line
    assert PW not in line


def test_an_unexpected_error_line_masks_secrets() -> None:
    """The CLI's last resort line (``unexpected X: message``) never prints a secret value."""
    import click

    from cli.errors import Guarded

    settings = Settings.from_env({"CAUSEWAY_KAFKA_SASL_PASSWORD": PW})

    @click.group(cls=Guarded)
    @click.pass_context
    def root(ctx: click.Context) -> None:
        ctx.obj = settings

    @root.command()
    def boom() -> None:
        raise RuntimeError(f"the client said: bad password {PW}")

    result = CliRunner().invoke(root, ["boom"])
    assert result.exit_code == 1 and "unexpected RuntimeError" in result.output
    assert PW not in result.output
