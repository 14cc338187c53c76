"""Secure connections: the one place that turns settings into client options for Kafka, Redis, Nessie.

Every client construction site spreads these options (``AIOKafkaConsumer(...,
**kafka_client_options(settings))``) so TLS, SASL and tokens are configured once. Secrets are
revealed only here, at the last moment, into the client library's own arguments; everything that
prints (``describe_*``, ``redact``) shows them masked.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
import subprocess
import threading
import time
from collections.abc import AsyncGenerator, Generator, Iterable
from pathlib import Path
from typing import Any

import httpx

from streams.settings import Secret, Settings, mask_url

log = logging.getLogger(__name__)

_NONE = Secret("")
KAFKA_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
KAFKA_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


class SecurityError(RuntimeError):
    """Credentials or certificates cannot be loaded or fetched; the message never holds a secret."""


# --------------------------------------------------------------------------------------------- TLS
def tls_context(
    ca_file: str = "",
    cert_file: str = "",
    key_file: str = "",
    key_password: Secret | None = None,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    """A client TLS context: system CAs or ``ca_file``, optional client certificate (mTLS).

    Certificates are always verified; ``check_hostname=False`` only skips the name check.
    """
    try:
        context = ssl.create_default_context(cafile=ca_file or None)
        if cert_file:
            password = key_password.reveal() if key_password else None
            context.load_cert_chain(cert_file, key_file or None, password=password or None)
    except (OSError, ssl.SSLError) as exc:
        # ssl errors name the file, never its contents.
        raise SecurityError(f"cannot load TLS files (ca={ca_file!r}, cert={cert_file!r}): {exc}") from None
    context.check_hostname = check_hostname
    return context


# ------------------------------------------------------------------------------------------- Kafka
class TokenSource:
    """An OAUTHBEARER token read from a file or printed by a command, cached for ``refresh_s``.

    aiokafka asks for a token at each (re)authentication; a token rotated in the file or by the
    command is picked up once the cache expires.
    """

    def __init__(self, command: str = "", file: str = "", refresh_s: float = 300.0) -> None:
        if not (command or file):
            raise SecurityError("OAUTHBEARER needs CAUSEWAY_KAFKA_OAUTH_TOKEN_COMMAND or _TOKEN_FILE")
        self.command, self.file, self.refresh_s = command, file, refresh_s
        self._token: Secret | None = None
        self._at = 0.0

    def read(self) -> Secret:
        if self._token is not None and time.monotonic() - self._at < self.refresh_s:
            return self._token
        if self.file:
            try:
                value = Path(self.file).read_text().strip()
            except OSError as exc:
                raise SecurityError(f"cannot read the Kafka token file {self.file!r}: {exc.strerror}") from None
        else:
            done = subprocess.run(self.command, shell=True, capture_output=True, text=True, timeout=30, check=False)
            if done.returncode != 0:
                # The command's stderr may echo credentials: report only the exit code.
                raise SecurityError(f"the Kafka token command exited with {done.returncode}")
            value = done.stdout.strip()
        if not value:
            raise SecurityError("the Kafka token source gave an empty token")
        self._token, self._at = Secret(value), time.monotonic()
        return self._token

    def __repr__(self) -> str:
        return f"TokenSource(file={self.file!r}, command={'***' if self.command else ''!r})"


def _answer_oauth_error_challenges() -> None:
    """Make aiokafka's OAUTHBEARER client answer the broker's error challenge, so a refused token fails.

    A broker that refuses a token sends an error challenge (``{"status":"invalid_token"}``, RFC 7628
    section 3.2.2) and waits for the client's ``%x01`` before it reports the failure. aiokafka 0.14
    takes the challenge for success and sends its next request inside the SASL exchange; the broker
    drops the connection and the client sees unrelated errors (unknown topic, timeouts). Answered,
    the broker replies SASL_AUTHENTICATION_FAILED and aiokafka raises SaslAuthenticationFailed.
    """
    from aiokafka.conn import OAuthAuthenticator

    if getattr(OAuthAuthenticator, "_causeway_answers_challenges", False):
        return
    step = OAuthAuthenticator.step

    async def answering_step(self: Any, payload: bytes | None) -> Any:
        if self._token_sent and payload:  # a non-empty server message after our token is an error challenge
            return b"\x01", True
        return await step(self, payload)

    OAuthAuthenticator.step = answering_step
    OAuthAuthenticator._causeway_answers_challenges = True


def _token_provider(source: TokenSource) -> Any:
    from aiokafka.abc import AbstractTokenProvider

    _answer_oauth_error_challenges()

    class _Provider(AbstractTokenProvider):
        async def token(self) -> str:
            return (await asyncio.to_thread(source.read)).reveal()

    return _Provider()


def kafka_client_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for every aiokafka client (consumer, producer, admin); ``{}`` for PLAINTEXT."""
    protocol = settings.kafka_security_protocol.upper()
    if protocol == "PLAINTEXT":
        return {}
    options: dict[str, Any] = {"security_protocol": protocol}
    if protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = kafka_tls_context(settings)
    if protocol.startswith("SASL_"):
        mechanism = settings.kafka_sasl_mechanism.upper()
        options["sasl_mechanism"] = mechanism
        if mechanism == "OAUTHBEARER":
            options["sasl_oauth_token_provider"] = _token_provider(kafka_token_source(settings))
        else:
            options["sasl_plain_username"] = settings.kafka_sasl_username
            options["sasl_plain_password"] = settings.kafka_sasl_password.reveal()
    return options


def kafka_tls_context(settings: Settings) -> ssl.SSLContext:
    return tls_context(
        settings.kafka_ssl_ca_file,
        settings.kafka_ssl_cert_file,
        settings.kafka_ssl_key_file,
        settings.kafka_ssl_key_password,
        settings.kafka_ssl_check_hostname,
    )


def kafka_token_source(settings: Settings) -> TokenSource:
    return TokenSource(
        settings.kafka_oauth_token_command, settings.kafka_oauth_token_file, settings.kafka_oauth_refresh_s
    )


def faust_broker_credentials(settings: Settings) -> Any:
    """The Faust app's ``broker_credentials`` for the same settings; None for PLAINTEXT."""
    import faust

    protocol = settings.kafka_security_protocol.upper()
    if protocol == "PLAINTEXT":
        return None
    context = kafka_tls_context(settings) if protocol in ("SSL", "SASL_SSL") else None
    if protocol == "SSL":
        return faust.SSLCredentials(context)
    mechanism = settings.kafka_sasl_mechanism.upper()
    if mechanism == "OAUTHBEARER":
        return faust.OAuthCredentials(oauth_cb=_token_provider(kafka_token_source(settings)), ssl_context=context)
    return faust.SASLCredentials(
        username=settings.kafka_sasl_username,
        password=settings.kafka_sasl_password.reveal(),
        ssl_context=context,
        mechanism=mechanism,
    )


def describe_kafka(settings: Settings) -> str:
    """The Kafka security mode in one line, e.g. ``SASL_SSL SCRAM-SHA-512 user causeway, CA /x/ca.crt``."""
    protocol = settings.kafka_security_protocol.upper()
    parts = [protocol]
    if protocol.startswith("SASL_"):
        mech = settings.kafka_sasl_mechanism.upper()
        parts.append(mech if mech == "OAUTHBEARER" else f"{mech} user {settings.kafka_sasl_username}")
    if protocol in ("SSL", "SASL_SSL"):
        parts.append(f"CA {settings.kafka_ssl_ca_file or 'system'}")
        if settings.kafka_ssl_cert_file:
            parts.append("client certificate")
        if not settings.kafka_ssl_check_hostname:
            parts.append("hostname check OFF")
    return ", ".join(parts)


# ------------------------------------------------------------------------------------------- Redis
def redis_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for ``Redis.from_url(settings.redis_url, ...)`` (sync or asyncio).

    Credentials in the URL win over the separate settings (redis-py applies the URL last).
    """
    options: dict[str, Any] = {}
    if settings.redis_username:
        options["username"] = settings.redis_username
    if settings.redis_password:
        options["password"] = settings.redis_password.reveal()
    if settings.redis_url.startswith("rediss://") and settings.redis_ca_file:
        options["ssl_ca_certs"] = settings.redis_ca_file
    return options


def describe_redis(settings: Settings) -> str:
    tls = settings.redis_url.startswith("rediss://")
    auth = "password" if settings.redis_password or "@" in settings.redis_url.reveal() else "no auth"
    user = settings.redis_username or _url_user(settings.redis_url.reveal())
    mode = f"TLS (CA {settings.redis_ca_file or 'system'})" if tls else "plaintext"
    return f"{mode}, {auth}" + (f" as {user}" if user and auth != "no auth" else "")


def _url_user(url: str) -> str:
    from urllib.parse import urlsplit

    return urlsplit(url).username or ""


# ------------------------------------------------------------------------------------------ Nessie
class NessieAuth(httpx.Auth):
    """Bearer auth for Nessie: a static token, or OAuth2 client credentials with a cached token.

    The OAuth2 token is fetched on first use and again ``refresh_margin_s`` before it expires; a 401
    answer drops the cached token and retries the request once with a fresh one.
    """

    def __init__(
        self,
        token: Secret = _NONE,
        token_url: str = "",
        client_id: str = "",
        client_secret: Secret = _NONE,
        scope: str = "",
        verify: Any = True,
        refresh_margin_s: float = 30.0,
    ) -> None:
        self._static = token
        self.token_url, self.client_id, self._client_secret, self.scope = token_url, client_id, client_secret, scope
        self._verify = verify
        self.refresh_margin_s = refresh_margin_s
        self._token: Secret | None = None
        self._expires = 0.0
        self._lock = threading.Lock()
        self.fetches = 0  # how many tokens were fetched (for tests and doctor)

    @property
    def oauth(self) -> bool:
        return bool(self.token_url)

    def _fresh(self) -> bool:
        return self._token is not None and time.monotonic() < self._expires - self.refresh_margin_s

    def _request_args(self) -> dict[str, Any]:
        data = {"grant_type": "client_credentials"}
        if self.scope:
            data["scope"] = self.scope
        return {"data": data, "auth": (self.client_id, self._client_secret.reveal())}

    def _accept(self, response: httpx.Response) -> Secret:
        if response.status_code != 200:
            raise SecurityError(
                f"Nessie OAuth2 token endpoint {mask_url(self.token_url)} answered {response.status_code}"
            )
        try:
            body = response.json()
            token = Secret(body["access_token"])
        except (ValueError, KeyError, TypeError):
            raise SecurityError(
                f"Nessie OAuth2 token endpoint {mask_url(self.token_url)} sent no access_token"
            ) from None
        self._token = token
        self._expires = time.monotonic() + float(body.get("expires_in") or 3600)
        self.fetches += 1
        return token

    def _sync_token(self, force: bool = False) -> Secret:
        with self._lock:
            if force or not self._fresh():
                try:
                    with httpx.Client(verify=self._verify, timeout=30) as http:
                        self._accept(http.post(self.token_url, **self._request_args()))
                except httpx.HTTPError as exc:
                    raise SecurityError(f"Nessie OAuth2 token endpoint unreachable: {type(exc).__name__}") from None
            assert self._token is not None
            return self._token

    async def _async_token(self, force: bool = False) -> Secret:
        if force or not self._fresh():
            try:
                async with httpx.AsyncClient(verify=self._verify, timeout=30) as http:
                    self._accept(await http.post(self.token_url, **self._request_args()))
            except httpx.HTTPError as exc:
                raise SecurityError(f"Nessie OAuth2 token endpoint unreachable: {type(exc).__name__}") from None
        assert self._token is not None
        return self._token

    @staticmethod
    def _set(request: httpx.Request, token: Secret) -> None:
        request.headers["Authorization"] = f"Bearer {token.reveal()}"

    def authorization(self, *, force: bool = False) -> str | None:
        """The ``Authorization`` header value for a synchronous request, None without a token;
        ``force`` fetches a new OAuth2 token (after a 401). Used by httpx's flow below and by the
        sync Nessie client's own connections (sinks.nessie_http)."""
        if self.oauth:
            return f"Bearer {self._sync_token(force).reveal()}"
        return f"Bearer {self._static.reveal()}" if self._static else None

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if (header := self.authorization()) is not None:
            request.headers["Authorization"] = header
        response = yield request
        if response.status_code == 401 and self.oauth:
            request.headers["Authorization"] = self.authorization(force=True) or ""
            yield request

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        if not self.oauth:
            if self._static:
                self._set(request, self._static)
            yield request
            return
        self._set(request, await self._async_token())
        response = yield request
        if response.status_code == 401:
            self._set(request, await self._async_token(force=True))
            yield request

    def __repr__(self) -> str:
        return f"NessieAuth(oauth={self.oauth}, token_url={mask_url(self.token_url)!r})"


def nessie_http_options(settings: Settings) -> dict[str, Any]:
    """``auth`` and ``verify`` for the httpx clients that talk to Nessie."""
    verify: Any = tls_context(settings.nessie_ca_file) if settings.nessie_ca_file else True
    options: dict[str, Any] = {"verify": verify}
    if settings.nessie_token or settings.nessie_oauth_token_url:
        options["auth"] = NessieAuth(
            token=settings.nessie_token,
            token_url=settings.nessie_oauth_token_url,
            client_id=settings.nessie_oauth_client_id,
            client_secret=settings.nessie_oauth_client_secret,
            scope=settings.nessie_oauth_scope,
            verify=verify,
        )
    return options


def describe_nessie(settings: Settings) -> str:
    tls = f"TLS (CA {settings.nessie_ca_file or 'system'})" if settings.nessie_url.startswith("https") else "plaintext"
    if settings.nessie_oauth_token_url:
        auth = f"OAuth2 client credentials as {settings.nessie_oauth_client_id}"
    elif settings.nessie_token:
        auth = "static bearer token"
    else:
        auth = "no auth"
    return f"{tls}, {auth}"


# --------------------------------------------------------------------------------------- redaction
def secret_values(settings: Settings) -> list[str]:
    """Every secret's clear value in ``settings`` (non-empty), longest first."""
    values = {v.reveal() for v in vars(settings).values() if type(v) is Secret and v.reveal()}
    # The password inside a URL is a secret too.
    for v in vars(settings).values():
        if isinstance(v, str) and "://" in v:
            m = re.match(r"^[a-z+]+://[^/@]*:([^/@]+)@", str.__str__(v))
            if m:
                values.add(m.group(1))
    return sorted((v for v in values if len(v) >= 4), key=len, reverse=True)


def redact(text: str, secrets: Iterable[str]) -> str:
    for value in secrets:
        text = text.replace(value, "***")
    return text


def scrub_exception(exc: BaseException, secrets: Iterable[str]) -> None:
    """Redact secret values in ``exc``'s arguments, so ``str(exc)`` shows ``***`` wherever it is printed later.

    Formatters that print ``Type: message`` themselves (the CLI's one-line formatter) never see the
    redacted traceback text; this covers them. Exceptions whose text does not come from ``args``
    keep it (the message and traceback of the record are still redacted).
    """
    secrets = list(secrets)
    if any(value in str(exc) for value in secrets):
        try:
            exc.args = tuple(redact(a, secrets) if isinstance(a, str) else a for a in exc.args)
        except (AttributeError, TypeError):  # pragma: no cover - an exception type with read-only args
            pass


class RedactingFilter(logging.Filter):
    """Replaces any secret value in a log record's final message (a last line of defence)."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self.secrets = list(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        if self.secrets:
            message = record.getMessage()
            clean = redact(message, self.secrets)
            if record.exc_info and record.exc_info[1] is not None:
                record.exc_text = redact(logging.Formatter().formatException(record.exc_info), self.secrets)
                scrub_exception(record.exc_info[1], self.secrets)
            if clean != message:
                record.msg, record.args = clean, None
        return True


def install_log_redaction(settings: Settings) -> None:
    """Redact every secret value of ``settings`` from every log record made in this process.

    A record factory, not a handler filter, so handlers added later (Faust's, mode's) are covered.
    Only records at an enabled level are built, so this costs nothing for suppressed debug logs.
    """
    scrub = RedactingFilter(secret_values(settings))
    if not scrub.secrets:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        scrub.filter(record)
        return record

    logging.setLogRecordFactory(factory)


# ------------------------------------------------------------------------------- failure explained
class KafkaFailureLog(logging.Handler):
    """Keeps aiokafka's last connection error: aiokafka logs the cause and raises only "Unable to bootstrap"."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.last = ""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "Unable connect to" in message or "SaslAuthenticationFailed" in message:
            self.last = message

    def __enter__(self) -> KafkaFailureLog:
        logging.getLogger("aiokafka").addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("aiokafka").removeHandler(self)


_REASONS = (
    ("invalid_token", "authentication failed: the broker refused the OAUTHBEARER token (expired or invalid)"),
    ("SaslAuthenticationFailed", "authentication failed: wrong user name or password, or an unknown SASL user"),
    ("UnsupportedSaslMechanism", "the broker does not enable this SASL mechanism"),
    ("IllegalSaslState", "the broker expects another SASL mechanism or protocol"),
    ("CERTIFICATE_VERIFY_FAILED", "the server certificate is not trusted (check the CA file setting)"),
    ("Hostname mismatch", "the server certificate does not name this host"),
    ("WRONG_VERSION_NUMBER", "TLS was used against a plaintext port (or the reverse)"),
    ("invalid username-password pair", "authentication failed: wrong user name or password"),
    ("NOAUTH", "the server wants a password and none was given"),
    ("Connection reset by peer", "the server closed the connection (a TLS port reached without TLS?)"),
    ("CERTIFICATE_REQUIRED", "the server requires a client certificate (mutual TLS): set the certificate and key"),
    (
        "KafkaConnectionError: Connection at",
        "the broker closed the connection during the handshake: it may require a client certificate "
        "(mutual TLS) or another security protocol",
    ),
    ("answered 401", "the OAuth2 token endpoint refused the client id or secret"),
    ("401", "Nessie refused the credentials (401): wrong, expired or missing token"),
    ("Unauthorized", "Nessie refused the credentials (401): wrong, expired or missing token"),
)


def security_reason(text: str) -> str:
    """What a failure's text says about credentials or TLS, in plain words; ``""`` when nothing."""
    return next((why for key, why in _REASONS if _says(text, key) or why in text), "")


def _says(text: str, key: str) -> bool:
    """``key`` occurs in ``text``; a number only as a whole word (port 39401 is not a 401)."""
    return re.search(rf"(?<!\d){key}(?!\d)", text) is not None if key.isdigit() else key in text


def explain_failure(exc: BaseException, settings: Settings, detail: str = "") -> str:
    """One line naming what went wrong with a secured connection; secrets replaced by ``***``.

    ``detail`` is extra text known to hold the cause (aiokafka's logged connection error).
    """
    text = f"{detail} {type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        text += f" {type(cause).__name__}: {cause}"
    if isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in (401, 403):
        reason = f"Nessie refused the credentials ({exc.response.status_code}): wrong, expired or missing token"
    else:
        reason = security_reason(text)
    first = redact(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", secret_values(settings))
    return f"{reason} ({first})" if reason else first
