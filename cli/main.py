"""The `causeway` command: one group, a subcommand per operator task, `--help` on each."""

from __future__ import annotations

import logging
import sys

import click

from streams.settings import Settings, SettingsError, markdown_table


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
        raise click.ClickException(str(exc)) from exc
    level = (log_level or settings.log_level).upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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

    Exits non-zero and names the failing service when one does not answer.

    \b
    Example:
      causeway doctor
    """
    from cli.doctor import run_checks

    ok = run_checks(settings, echo=click.echo)
    if not ok:
        raise click.ClickException("some services failed; start them with: scripts/services.sh start")


def _register_optional_groups() -> None:
    """Attach command groups whose modules exist; each owns its own --help text."""
    import importlib

    for module, attr in (
        ("cli.worlds", "worlds"),
        ("cli.world_history", "worlds"),
        ("cli.world_merge", "worlds"),
        ("cli.gc", "gc"),
        ("cli.worker", "worker"),
        ("cli.demo", "demo"),
        ("cli.ops", "replay"),
        ("cli.ops", "dlq"),
        ("cli.ops", "offsets"),
        ("cli.ops", "rebuild"),
        ("cli.reconcile", "reconcile"),
        ("cli.publish", "publish"),
    ):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name == module:
                continue
            raise
        command = getattr(mod, attr, None)
        if command is not None:
            cli.add_command(command)


_register_optional_groups()


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
