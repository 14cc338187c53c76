"""Secrets stay masked and settings become the right client options (no services needed)."""

from __future__ import annotations

import logging
import ssl
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from streams.security import (
    NessieAuth,
    RedactingFilter,
    SecurityError,
    TokenSource,
    describe_kafka,
    describe_redis,
    explain_failure,
    faust_broker_credentials,
    kafka_client_options,
    nessie_http_options,
    redis_options,
    secret_values,
)
from streams.settings import Secret, SecretUrl, Settings, SettingsError, mask_url

PW = "s3cr3t-Pa55word-xyz"


def test_secret_masks_every_way_of_printing() -> None:
    s = Secret(PW)
    for shown in (str(s), repr(s), f"{s}", f"{s!s}", "%s" % s, f"{s:>30}"):  # noqa: UP031
        assert PW not in shown
    assert s.reveal() == PW and type(s.reveal()) is str


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"redis://:{PW}@host:6379/0", "redis://:***@host:6379/0"),
        (f"rediss://app:{PW}@host:6380/1", "rediss://app:***@host:6380/1"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        (f"https://{PW}@nessie/api", "https://***@nessie/api"),
    ],
)
def test_urls_print_with_credentials_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    u = SecretUrl(url)
    assert str(u) == shown and f"{u}" == shown and repr(u) == repr(shown)
    assert u.reveal() == url


def test_redis_password_in_url_never_shows_in_config_or_repr() -> None:
    """The issue's bug: `causeway config` printed CAUSEWAY_REDIS_URL's password in clear."""
    env = {"CAUSEWAY_REDIS_URL": f"redis://:{PW}@127.0.0.1:6379/0", "CAUSEWAY_KAFKA_SASL_PASSWORD": PW + "k"}
    s = Settings.from_env(env)
    assert s.redis_url.reveal() == env["CAUSEWAY_REDIS_URL"]
    assert PW not in repr(s)
    from cli.main import cli

    result = CliRunner().invoke(cli, ["config"], env=env)
    assert result.exit_code == 0, result.output
    assert "redis://:***@127.0.0.1:6379/0" in result.output
    assert PW not in result.output


def test_bad_security_settings_name_the_variable() -> None:
    with pytest.raises(SettingsError, match="CAUSEWAY_KAFKA_SECURITY_PROTOCOL"):
        Settings.from_env({"CAUSEWAY_KAFKA_SECURITY_PROTOCOL": "TLS"})
    with pytest.raises(SettingsError, match="CAUSEWAY_KAFKA_SASL_MECHANISM"):
        Settings.from_env({"CAUSEWAY_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "CAUSEWAY_KAFKA_SASL_MECHANISM": "GSSAPI"})
    with pytest.raises(SettingsError, match="CAUSEWAY_REDIS_URL") as info:
        Settings.from_env({"CAUSEWAY_REDIS_URL": f"http://:{PW}@x"})
    assert PW not in str(info.value)


def test_plaintext_kafka_adds_no_options() -> None:
    s = Settings.from_env({})
    assert kafka_client_options(s) == {}
    assert faust_broker_credentials(s) is None
    assert redis_options(s) == {}
    assert nessie_http_options(s) == {"verify": True}


def _ca(tmp_path: Path) -> str:
    """A CA file: the certifi bundle httpx already depends on is a valid PEM bundle."""
    import certifi

    return certifi.where()


async def test_sasl_ssl_scram_options(tmp_path: Path) -> None:
    s = Settings.from_env(
        {
            "CAUSEWAY_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "CAUSEWAY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
            "CAUSEWAY_KAFKA_SASL_USERNAME": "app",
            "CAUSEWAY_KAFKA_SASL_PASSWORD": PW,
            "CAUSEWAY_KAFKA_SSL_CA_FILE": _ca(tmp_path),
        }
    )
    opts = kafka_client_options(s)
    assert opts["security_protocol"] == "SASL_SSL" and opts["sasl_mechanism"] == "SCRAM-SHA-256"
    assert opts["sasl_plain_username"] == "app" and opts["sasl_plain_password"] == PW
    ctx = opts["ssl_context"]
    assert isinstance(ctx, ssl.SSLContext) and ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    creds = faust_broker_credentials(s)
    assert creds.protocol.value == "SASL_SSL" and creds.mechanism.value == "SCRAM-SHA-256"
    assert PW not in repr(creds)
    assert describe_kafka(s).startswith("SASL_SSL, SCRAM-SHA-256 user app")
    assert PW not in describe_kafka(s)

    from aiokafka import AIOKafkaConsumer

    # aiokafka accepts the options as they are (it validates them in its constructor).
    AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", **opts)


def test_hostname_check_can_be_turned_off_but_verification_stays() -> None:
    s = Settings.from_env({"CAUSEWAY_KAFKA_SECURITY_PROTOCOL": "SSL", "CAUSEWAY_KAFKA_SSL_CHECK_HOSTNAME": "false"})
    ctx = kafka_client_options(s)["ssl_context"]
    assert not ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    assert "hostname check OFF" in describe_kafka(s)


def test_missing_ca_file_is_a_clear_error() -> None:
    s = Settings.from_env({"CAUSEWAY_KAFKA_SECURITY_PROTOCOL": "SSL", "CAUSEWAY_KAFKA_SSL_CA_FILE": "/nope/ca.pem"})
    with pytest.raises(SecurityError, match="/nope/ca.pem"):
        kafka_client_options(s)


def oauth_provider(token_file: Path) -> Any:
    """The aiokafka token provider causeway builds for a token file, re-read at every request."""
    s = Settings.from_env(
        {
            "CAUSEWAY_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "CAUSEWAY_KAFKA_SASL_MECHANISM": "OAUTHBEARER",
            "CAUSEWAY_KAFKA_OAUTH_TOKEN_FILE": str(token_file),
            "CAUSEWAY_KAFKA_OAUTH_REFRESH_S": "0",
        }
    )
    return kafka_client_options(s)["sasl_oauth_token_provider"]


async def test_oauthbearer_token_file_is_reread_after_refresh(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("tok-1\n")
    provider = oauth_provider(token_file)
    assert await provider.token() == "tok-1"
    token_file.write_text("tok-2\n")
    assert await provider.token() == "tok-2"


def test_token_command_is_cached_and_failures_hide_output() -> None:
    source = TokenSource(command=f"{sys.executable} -c \"print('tok-cmd')\"", refresh_s=3600)
    assert source.read().reveal() == "tok-cmd"
    source.command = "false"
    assert source.read().reveal() == "tok-cmd"  # still cached
    failing = TokenSource(command=f"echo {PW} >&2; exit 3")
    with pytest.raises(SecurityError) as info:
        failing.read()
    assert "exited with 3" in str(info.value) and PW not in str(info.value)


def test_redis_options_user_password_and_ca() -> None:
    s = Settings.from_env(
        {
            "CAUSEWAY_REDIS_URL": "rediss://127.0.0.1:6380/0",
            "CAUSEWAY_REDIS_USERNAME": "app",
            "CAUSEWAY_REDIS_PASSWORD": PW,
            "CAUSEWAY_REDIS_CA_FILE": "/etc/ca.pem",
        }
    )
    assert redis_options(s) == {"username": "app", "password": PW, "ssl_ca_certs": "/etc/ca.pem"}
    assert describe_redis(s) == "TLS (CA /etc/ca.pem), password as app"
    import redis

    client = redis.Redis.from_url(s.redis_url, **redis_options(s))
    kw = client.connection_pool.connection_kwargs
    assert kw["password"] == PW and kw["username"] == "app" and kw["ssl_ca_certs"] == "/etc/ca.pem"


def _token_server(issued: list[str], expires_in: float = 3600) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/oauth/token":
            assert request.headers["Authorization"].startswith("Basic ")
            token = f"tok-{len(issued)}"
            issued.append(token)
            return httpx.Response(200, json={"access_token": token, "expires_in": expires_in})
        valid = issued[-1:] if issued else []
        if request.headers.get("Authorization") in [f"Bearer {t}" for t in valid]:
            return httpx.Response(200, json={"ok": True})
        return httpx.Response(401)

    return httpx.MockTransport(handler)


def test_nessie_oauth_token_is_cached_refreshed_and_retried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    issued: list[str] = []
    transport = _token_server(issued)
    real_client = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real_client(transport=transport, **kw))
    auth = NessieAuth(token_url="https://idp/oauth/token", client_id="c", client_secret=Secret(PW))
    with real_client(transport=transport, auth=auth, base_url="https://nessie") as http:
        assert http.get("/x").status_code == 200
        assert http.get("/x").status_code == 200
        assert auth.fetches == 1  # cached
        issued.append("rotated-on-the-server")  # the cached token is no longer valid: 401, refetch once
        assert http.get("/x").status_code == 200
        assert auth.fetches == 2
    assert PW not in repr(auth)


async def test_nessie_oauth_refreshes_before_expiry_async(monkeypatch: pytest.MonkeyPatch) -> None:
    issued: list[str] = []
    transport = _token_server(issued, expires_in=10)  # inside the 30 s margin: every request refreshes
    real_client = httpx.AsyncClient
    monkeypatch.setattr(httpx, "AsyncClient", lambda **kw: real_client(transport=transport, **kw))
    auth = NessieAuth(token_url="https://idp/oauth/token", client_id="c", client_secret=Secret(PW))
    async with real_client(transport=transport, auth=auth, base_url="https://nessie") as http:
        assert (await http.get("/x")).status_code == 200
        assert (await http.get("/x")).status_code == 200
    assert auth.fetches == 2


def test_nessie_oauth_refused_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(401, json={"error": "invalid_client"}))
    real_client = httpx.Client
    monkeypatch.setattr(httpx, "Client", lambda **kw: real_client(transport=transport, **kw))
    auth = NessieAuth(token_url="https://idp/oauth/token", client_id="c", client_secret=Secret(PW))
    with real_client(transport=transport, auth=auth) as http, pytest.raises(SecurityError, match="answered 401"):
        http.get("https://nessie/x")


def test_explain_failure_names_the_cause_in_one_line_without_secrets() -> None:
    s = Settings.from_env({"CAUSEWAY_KAFKA_SASL_PASSWORD": PW})
    line = explain_failure(
        RuntimeError("Unable to bootstrap"),
        s,
        "Unable connect to x: [Error 58] SaslAuthenticationFailed: invalid credentials",
    )
    assert line.startswith("authentication failed") and "\n" not in line
    assert PW not in explain_failure(RuntimeError(f"boom {PW}\nsecond line"), s)


def test_redacting_filter_scrubs_messages_and_tracebacks() -> None:
    s = Settings.from_env({"CAUSEWAY_REDIS_URL": f"redis://:{PW}@h:1/0", "CAUSEWAY_NESSIE_TOKEN": "tok-abcdef"})
    assert set(secret_values(s)) == {PW, "tok-abcdef"}
    handler = logging.Handler()
    records: list[str] = []
    handler.emit = lambda r: records.append(handler.format(r))  # type: ignore[method-assign]
    handler.addFilter(RedactingFilter(secret_values(s)))
    logger = logging.getLogger("test.redaction")
    logger.addHandler(handler)
    try:
        logger.warning("connecting with %s", "tok-abcdef")
        try:
            raise ValueError(f"bad url redis://:{PW}@h")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    text = "\n".join(records)
    assert "connecting with ***" in text and "ValueError" in text
    assert PW not in text and "tok-abcdef" not in text


def test_log_redaction_covers_handlers_added_later() -> None:
    from streams.security import install_log_redaction

    previous = logging.getLogRecordFactory()
    install_log_redaction(Settings.from_env({"CAUSEWAY_KAFKA_SASL_PASSWORD": PW}))
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(handler.format(r))  # type: ignore[method-assign]
    logger = logging.getLogger("test.redaction.later")
    logger.addHandler(handler)
    try:
        logger.error("sasl config %r", {"sasl_plain_password": PW})
    finally:
        logger.removeHandler(handler)
        logging.setLogRecordFactory(previous)
    assert records and PW not in records[0] and "***" in records[0]


async def test_oauthbearer_client_answers_the_brokers_error_challenge(tmp_path: Path) -> None:
    """A refused token must end in SaslAuthenticationFailed: the client acknowledges the error challenge
    (RFC 7628 3.2.2) instead of taking it for success (aiokafka 0.14 alone sends its next request)."""
    from aiokafka.conn import OAuthAuthenticator

    token = tmp_path / "token"
    token.write_text("tok-abcdef")
    provider = oauth_provider(token)
    refused = OAuthAuthenticator(sasl_oauth_token_provider=provider)
    first, _ = await refused.step(None)
    assert b"auth=Bearer tok-abcdef" in first
    assert await refused.step(b'{"status":"invalid_token"}') == (b"\x01", True)
    accepted = OAuthAuthenticator(sasl_oauth_token_provider=provider)
    await accepted.step(None)
    assert await accepted.step(b"") is None  # success: nothing more to send


def test_a_port_number_holding_401_is_not_read_as_a_refused_credential() -> None:
    """A Kafka down at 127.0.0.1:39401 was explained as "Nessie refused the credentials (401)"
    (seen in tests/integration/test_ops_down.py, whose closed port is random)."""
    from streams.security import security_reason

    down = "KafkaConnectionError: Unable to bootstrap from [('127.0.0.1', 39401, <AddressFamily.AF_INET: 2>)]"
    assert security_reason(down) == ""
    assert security_reason("Client error '401 Unauthorized' for url 'https://x/api/v2/config'").startswith("Nessie")
    assert security_reason("HTTP status 401").startswith("Nessie refused the credentials (401)")
