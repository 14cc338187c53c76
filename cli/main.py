"""The `causeway` command: one group, a subcommand per operator task, `--help` on each."""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any

import click

from cli import world_history, world_merge  # noqa: F401  (they add their commands to the worlds group)
from cli.demo import demo
from cli.dlq import dlq
from cli.errors import CommandError, Exit, Guarded, OneLineFormatter
from cli.gc import gc
from cli.offsets import offsets
from cli.publish import publish
from cli.rebuild import rebuild
from cli.reconcile import reconcile
from cli.replay import replay
from cli.serve import api_token, serve
from cli.tables import tables
from cli.worker import worker
from cli.worlds import worlds
from streams.security import install_log_redaction
from streams.settings import Settings, SettingsError, markdown_table

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The services each command needs, checked before it starts (``cli.preflight``); the longest
#: matching command path wins, so a new subcommand of ``worlds`` inherits ``worlds``'s entry. A dry
#: run needs what the real run needs: it makes the same checks.
NEEDS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("worlds",): ("nessie",),
    ("replay",): ("kafka", "redis", "nessie"),
    ("dlq",): ("kafka",),
    ("dlq", "redrive"): ("kafka", "redis", "nessie"),
    ("offsets",): ("kafka",),
    ("rebuild",): ("nessie",),
    ("reconcile",): ("kafka", "nessie"),
    ("worker",): ("kafka", "redis", "nessie"),
    ("demo",): ("kafka", "redis", "nessie"),
}


def needs(path: tuple[str, ...]) -> tuple[str, ...]:
    """The services for a command path such as ``("dlq", "list")`` (longest prefix in NEEDS)."""
    for n in range(len(path), 0, -1):
        if path[:n] in NEEDS:
            return NEEDS[path[:n]]
    return ()


@click.group(cls=Guarded, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--log-level", default=None, help="Override CAUSEWAY_LOG_LEVEL (debug, info, warning).")
@click.pass_context
def cli(ctx: click.Context, log_level: str | None) -> None:
    """Causeway: ontology change events from Kafka, applied in causal order exactly once,
    committed as Iceberg tables on Project Nessie branches (one per world).

    Every setting comes from CAUSEWAY_* environment variables; `causeway config` lists them.
    """
    try:
        settings = Settings.from_env()
    except SettingsError as exc:
        raise CommandError(str(exc), Exit.USAGE) from exc
    level = (log_level or settings.log_level).upper()
    before = set(logging.getLogger().handlers)
    logging.basicConfig(level=level, format=LOG_FORMAT)
    if level != "DEBUG" and ctx.invoked_subcommand != "worker":
        for handler in set(logging.getLogger().handlers) - before:  # ours only, not an embedding app's
            handler.setFormatter(OneLineFormatter(LOG_FORMAT))
    install_log_redaction(settings)
    if level != "DEBUG":
        # Client libraries log every request at INFO; operators want causeway's own lines.
        for noisy in ("httpx", "aiokafka", "kafka"):
            logging.getLogger(noisy).setLevel(logging.WARNING)
    ctx.obj = settings


@cli.command()
@click.option("--markdown", is_flag=True, help="Print the README's configuration table.")
@click.pass_obj
def config(settings: Settings, markdown: bool) -> None:
    """Show the effective configuration (secrets hidden).

    \b
    Example:
      CAUSEWAY_BATCH_MAX_EVENTS=5000 causeway config
    """
    if markdown:
        click.echo(markdown_table())
        return
    for name, value in vars(settings).items():
        click.echo(f"{name:24} {value!r}")


@cli.command()
@click.pass_obj
def doctor(settings: Settings) -> None:
    """Check every service with a real round trip: Kafka, Redis, Nessie, Prometheus.

    Each service gets one line: ok, DOWN (nothing answers: not running, or a wrong host/port) or
    WRONG (something else answers at that URL). Exits 4 when any is not ok.

    \b
    Example:
      causeway doctor
    """
    from cli.doctor import run_checks

    ok = run_checks(settings, echo=click.echo)
    if not ok:
        raise CommandError(
            "some services failed: DOWN = nothing answers (start it: scripts/services.sh start, or fix the "
            "host/port), WRONG = the URL points at another service (fix the CAUSEWAY_* URL)",
            Exit.UNAVAILABLE,
        )


def _check_services_first(group: click.Group, path: tuple[str, ...] = ()) -> None:
    """Wrap every command's callback so the services it needs (NEEDS) are probed first: after its
    options were parsed (a usage error stays exit 2), before it does anything (cli.preflight)."""
    for name, command in group.commands.items():
        here = (*path, name)
        if isinstance(command, click.Group):
            _check_services_first(command, here)
        elif command.callback is not None and needs(here) and not getattr(command.callback, "_preflight", False):
            command.callback = _with_preflight(command.callback, needs(here))


def _with_preflight(callback: Callable[..., Any], services: tuple[str, ...]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        from cli.preflight import require

        settings = click.get_current_context().find_object(Settings)
        require(settings or Settings.from_env(), *services)
        return callback(*args, **kwargs)

    run._preflight = True  # type: ignore[attr-defined]
    return run


# Every command group, registered with plain imports (a missing module is an ImportError, not a
# silently absent command). cli.world_history and cli.world_merge add their commands to `worlds`.
for _command in (
    worlds,
    gc,
    worker,
    demo,
    replay,
    dlq,
    offsets,
    rebuild,
    reconcile,
    serve,
    api_token,
    tables,
    publish,
):
    cli.add_command(_command)
_check_services_first(cli)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(Exit.INTERRUPTED)


if __name__ == "__main__":
    main()
