"""`causeway worker`: run one change-applier worker process."""

from __future__ import annotations

import click

from streams.settings import Settings


@click.command()
@click.option("--web-port", type=int, default=None, help="Serve /metrics and /health here (CAUSEWAY_WEB_PORT).")
@click.pass_obj
def worker(settings: Settings, web_port: int | None) -> None:
    """Run a worker: consume the change topics, apply events per world, commit to Nessie.

    Start several on different --web-port values to share the partitions (one consumer group).
    Stop with Ctrl-C or SIGTERM: released events are committed before it exits.

    \b
    Example:
      causeway worker --web-port 6066
    """
    from agents.worker import run_worker
    from cdc.mapping import MappingError

    if web_port is not None:
        settings = settings.replace(web_port=web_port)
    from aiokafka.errors import KafkaConnectionError

    from streams.security import KafkaFailureLog, explain_failure

    try:
        with KafkaFailureLog() as kafka_log:
            run_worker(settings)
    except MappingError as exc:
        raise click.ClickException(str(exc)) from None
    except KafkaConnectionError as exc:  # a wrong password, user or certificate: one line, not a traceback
        raise click.ClickException(f"kafka: {explain_failure(exc, settings, kafka_log.last)}") from None
