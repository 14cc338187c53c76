"""A bearer-token check in front of Nessie for the secured local stack (scripts/services.sh --secure).

Nessie's own authentication needs an external OpenID Connect provider; this proxy stands in for one
so causeway's Nessie auth can be tested end to end. It serves HTTPS and:

- ``POST /oauth/token`` (OAuth2 client credentials, client id and secret by HTTP basic auth or form
  fields) issues a random access token valid ``CAUSEWAY_PROXY_TOKEN_TTL_S`` seconds (a form field
  ``ttl_s`` may ask for less, so tests can watch a token expire);
- ``GET /healthz`` answers without auth;
- every other request is forwarded to the upstream Nessie only with ``Authorization: Bearer <t>``
  where ``t`` is the static token or an issued, unexpired one; anything else gets 401 and never
  reaches Nessie. ``POST /_proxy/revoke`` (static token only) forgets every issued token.

Configuration comes from environment variables (secrets from a file, never the command line):
``CAUSEWAY_PROXY_PORT``, ``CAUSEWAY_PROXY_UPSTREAM``, ``CAUSEWAY_PROXY_CERT``, ``CAUSEWAY_PROXY_KEY``,
``CAUSEWAY_PROXY_SECRETS`` (a file of ``NAME=value`` lines with NESSIE_TOKEN, NESSIE_CLIENT_ID,
NESSIE_CLIENT_SECRET).
"""

from __future__ import annotations

import base64
import hmac
import os
import secrets
import ssl
import time
from pathlib import Path

import aiohttp
from aiohttp import web

HOP_HEADERS = {"host", "authorization", "content-length", "transfer-encoding", "connection"}


def read_secrets(path: str) -> dict[str, str]:
    out = {}
    for line in Path(path).read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep:
            out[name.strip()] = value.strip()
    return out


class TokenProxy:
    def __init__(self, upstream: str, static_token: str, client_id: str, client_secret: str, ttl_s: float) -> None:
        self.upstream = upstream.rstrip("/")
        self.static_token = static_token
        self.client_id, self.client_secret = client_id, client_secret
        self.ttl_s = ttl_s
        self.issued: dict[str, float] = {}  # token -> expiry (monotonic)
        self.session: aiohttp.ClientSession | None = None

    def _valid(self, header: str) -> bool:
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        if hmac.compare_digest(token, self.static_token):
            return True
        expiry = self.issued.get(token)
        return expiry is not None and time.monotonic() < expiry

    @staticmethod
    def _denied(reason: str) -> web.Response:
        return web.json_response(
            {"status": 401, "reason": "Unauthorized", "message": reason},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="nessie"'},
        )

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        client_id, client_secret = str(form.get("client_id", "")), str(form.get("client_secret", ""))
        basic = request.headers.get("Authorization", "")
        if basic.lower().startswith("basic "):
            try:
                client_id, _, client_secret = base64.b64decode(basic[6:]).decode().partition(":")
            except ValueError:
                return web.json_response({"error": "invalid_request"}, status=400)
        if form.get("grant_type") != "client_credentials":
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        if not (
            hmac.compare_digest(client_id, self.client_id) and hmac.compare_digest(client_secret, self.client_secret)
        ):
            return web.json_response({"error": "invalid_client"}, status=401)
        ttl = min(self.ttl_s, float(str(form.get("ttl_s", self.ttl_s))))
        token = secrets.token_urlsafe(32)
        now = time.monotonic()
        self.issued = {t: e for t, e in self.issued.items() if e > now}
        self.issued[token] = now + ttl
        return web.json_response({"access_token": token, "token_type": "bearer", "expires_in": ttl})

    async def revoke(self, request: web.Request) -> web.Response:
        if not hmac.compare_digest(request.headers.get("Authorization", ""), f"Bearer {self.static_token}"):
            return self._denied("revoking needs the static token")
        n = len(self.issued)
        self.issued.clear()
        return web.json_response({"revoked": n})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "UP"})

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if not self._valid(request.headers.get("Authorization", "")):
            return self._denied("missing, unknown or expired bearer token")
        assert self.session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = await request.read()
        async with self.session.request(
            request.method, self.upstream + request.rel_url.path_qs, headers=headers, data=body or None
        ) as resp:
            payload = await resp.read()
            keep = {k: v for k, v in resp.headers.items() if k.lower() in ("content-type", "location")}
            return web.Response(status=resp.status, body=payload, headers=keep)

    async def on_startup(self, app: web.Application) -> None:
        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))

    async def on_cleanup(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/oauth/token", self.token)
        app.router.add_post("/_proxy/revoke", self.revoke)
        app.router.add_get("/healthz", self.health)
        app.router.add_route("*", "/{tail:.*}", self.forward)
        app.on_startup.append(self.on_startup)
        app.on_cleanup.append(self.on_cleanup)
        return app


def main() -> None:
    env = os.environ
    conf = read_secrets(env["CAUSEWAY_PROXY_SECRETS"])
    proxy = TokenProxy(
        env.get("CAUSEWAY_PROXY_UPSTREAM", "http://127.0.0.1:19120"),
        conf["NESSIE_TOKEN"],
        conf["NESSIE_CLIENT_ID"],
        conf["NESSIE_CLIENT_SECRET"],
        float(env.get("CAUSEWAY_PROXY_TOKEN_TTL_S", "300")),
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(env["CAUSEWAY_PROXY_CERT"], env["CAUSEWAY_PROXY_KEY"])
    web.run_app(
        proxy.app(), host="127.0.0.1", port=int(env["CAUSEWAY_PROXY_PORT"]), ssl_context=context, access_log=None
    )


if __name__ == "__main__":
    main()
