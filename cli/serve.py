"""`causeway serve` (the world manager gRPC API) and `causeway api-token` (add a caller to its token file)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from api.auth import Role, new_token, parse_tokens, token_line
from streams.settings import Settings


@click.command()
@click.option("--bind", default=None, help="host:port to listen on (default CAUSEWAY_API_BIND).")
@click.pass_obj
def serve(settings: Settings, bind: str | None) -> None:
    """Serve the world manager gRPC API (worlds, releases, history, diff, audit, time travel,
    rollback, ApplyChanges) with health checking and reflection.

    Callers need a bearer token from the token file (CAUSEWAY_API_TOKENS_FILE); TLS is on when
    CAUSEWAY_API_TLS_CERT and CAUSEWAY_API_TLS_KEY are set. See docs/api.md.

    \b
    Example:
      causeway api-token ops-bot --role operator   # prints the token once
      causeway serve --bind 0.0.0.0:50051
    """
    from api.server import ServerConfigError
    from api.server import serve as run

    try:
        asyncio.run(run(settings, bind))
    except ServerConfigError as exc:
        raise click.ClickException(str(exc)) from exc


@click.command("api-token")
@click.argument("name")
@click.option("--role", type=click.Choice([r.name for r in Role]), default="reader", show_default=True)
@click.option("--file", "path", default=None, help="Token file (default CAUSEWAY_API_TOKENS_FILE).")
@click.pass_obj
def api_token(settings: Settings, name: str, role: str, path: str | None) -> None:
    """Create a token for NAME with ROLE: appends its hash to the token file and prints the token once.

    The server reads the file at start; restart it to pick up a new token.

    \b
    Example:
      causeway api-token grafana --role reader
    """
    file = Path(path or settings.api_tokens_file)
    existing = file.read_text() if file.exists() else ""
    if any(p.name == name for p in parse_tokens(existing).values()):
        raise click.ClickException(f"{file} already has a token named {name!r}; pick another name")
    token = new_token()
    file.parent.mkdir(parents=True, exist_ok=True)
    with file.open("a") as f:
        f.write(token_line(name, Role[role], token) + "\n")
    file.chmod(0o600)
    click.echo(token)
