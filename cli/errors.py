"""Exit codes, and the one place where an expected failure becomes one clear line (never a traceback).

Every ``causeway`` command runs under :class:`Guarded` (the root group), so a command added later
gets the same treatment without doing anything. An exception is matched by kind, walking its
``__cause__`` / ``__context__`` chain (pyiceberg and aiokafka wrap the error that matters):

* a service that does not answer (connection refused, timeout, DNS) → exit 4, naming the service,
  its URL with credentials masked, and what to check;
* a URL that answers but is not that service (a 404 page instead of Nessie's API) → exit 4 too;
* an operator mistake the domain refuses (unknown world, bad id, refused reset) → exit 1;
* anything else → exit 1 with its type and message; ``--log-level debug`` shows the traceback.

``docs/operations.md`` ("Exit codes") documents the table below; tests assert it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from enum import IntEnum
from typing import Any

import click

from streams.settings import Settings, mask_url

log = logging.getLogger(__name__)


class Exit(IntEnum):
    """What a ``causeway`` command's exit status means (the same for every command)."""

    OK = 0  # done: everything asked was done (or nothing was needed)
    ERROR = 1  # an error: nothing or only part was done; the line says what and why
    USAGE = 2  # bad options or arguments (click's own code); nothing was done
    INCOMPLETE = 3  # finished, but not everything: a replay left records, a redrive refused letters, a rebuild differs
    UNAVAILABLE = 4  # a service is down, or its URL points at something else; nothing was changed by this line
    INTERRUPTED = 130  # Ctrl-C / SIGINT (after saving what can be resumed)


class CommandError(click.ClickException):
    """A failure with its exit code; printed as ``Error: <message>``."""

    def __init__(self, message: str, code: Exit = Exit.ERROR) -> None:
        super().__init__(" ".join(message.split()))  # one line, whatever a server put in its answer
        self.exit_code = int(code)


class Incomplete(click.ClickException):
    """The command did its work but not all of it (summary printed already); exit 3."""

    exit_code = int(Exit.INCOMPLETE)

    def show(self, file: Any = None) -> None:
        click.echo(f"Incomplete: {self.message}", err=True)


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _kafka_down(exc: BaseException) -> bool:
    from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError, NoBrokersAvailable

    try:
        from kafka.errors import NoBrokersAvailable as OldNoBrokers  # aiokafka < 0.11 used kafka-python's
    except ImportError:  # pragma: no cover - depends on the installed client
        OldNoBrokers = NoBrokersAvailable  # noqa: N806
    return isinstance(exc, KafkaConnectionError | KafkaTimeoutError | NoBrokersAvailable | OldNoBrokers)


def _redis_down(exc: BaseException) -> bool:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return isinstance(exc, RedisConnectionError | RedisTimeoutError)


def unavailable(service: str, url: str, why: str, check: str) -> str:
    """The one line for a service that did not answer usefully."""
    return f"{service} unavailable at {mask_url(url)}: {why}; {check}"


def explain(exc: BaseException, settings: Settings | None) -> tuple[str, Exit] | None:
    """The line and exit code for an expected failure, or None when ``exc`` is not one."""
    from models.worlds import InvalidWorldId
    from ops.offsets.plan import ResetRefused
    from ops.rebuild.run import RebuildError
    from ops.replay.plan import ReplayError
    from ops.replay.run import DependencyDown
    from sinks.errors import (
        CommitStateUnknown,
        NessieAuthError,
        NessieError,
        NessieNotAnApi,
        NessieUnavailable,
        TableUnreadable,
    )
    from worlds.manager import WorldError

    s = settings or Settings()
    check_hint = "check it runs (`causeway doctor`) and "
    for e in _chain(exc):
        if isinstance(e, NessieNotAnApi):
            return (
                unavailable("Nessie", s.nessie_url, str(e), "check CAUSEWAY_NESSIE_URL (it ends in /api/v2)"),
                Exit.UNAVAILABLE,
            )
        if isinstance(e, CommitStateUnknown):
            return (f"Nessie at {mask_url(s.nessie_url)}: {e}; check the branch history before retrying", Exit.ERROR)
        if isinstance(e, NessieUnavailable):
            return (
                unavailable("Nessie", s.nessie_url, e.message, check_hint + "CAUSEWAY_NESSIE_URL"),
                Exit.UNAVAILABLE,
            )
        if isinstance(e, NessieAuthError):
            return (f"Nessie at {mask_url(s.nessie_url)} refused: {e}; check CAUSEWAY_NESSIE_TOKEN", Exit.ERROR)
        if _kafka_down(e):
            return (
                unavailable(
                    "Kafka", s.kafka_bootstrap, f"{type(e).__name__}: {e}", check_hint + "CAUSEWAY_KAFKA_BOOTSTRAP"
                ),
                Exit.UNAVAILABLE,
            )
        if _redis_down(e):
            return (
                unavailable("Redis", s.redis_url, f"{type(e).__name__}: {e}", check_hint + "CAUSEWAY_REDIS_URL"),
                Exit.UNAVAILABLE,
            )
        if isinstance(e, NessieError):
            return (f"Nessie at {mask_url(s.nessie_url)}: {e}", Exit.ERROR)
        if isinstance(e, DependencyDown):
            return (str(e), Exit.UNAVAILABLE)
        if isinstance(e, WorldError | InvalidWorldId | ReplayError | RebuildError):
            return (str(e), Exit.ERROR)
        if isinstance(e, ResetRefused):
            return (f"reset refused: {e}", Exit.ERROR)
        if isinstance(e, TableUnreadable):
            # Most often a branch written with another warehouse (an earlier run's, a removed folder).
            return (
                f"{e}; the branch's tables point at a file this warehouse ({mask_url(s.warehouse)}) does not hold: "
                "check CAUSEWAY_WAREHOUSE, or restore the files, roll the world back or re-create it",
                Exit.ERROR,
            )
    for e in _chain(exc):
        if isinstance(e, ConnectionRefusedError | socket.gaierror | TimeoutError):
            return (f"a service did not answer: {type(e).__name__}: {e}; run `causeway doctor`", Exit.UNAVAILABLE)
    return None


class OneLineFormatter(logging.Formatter):
    """Log lines without tracebacks: an exception adds ``(Type: message)`` to its line instead.

    The CLI's handlers use it unless ``--log-level debug``, so a failure logged deep inside (a
    reconciliation pass, a retry) stays one line on the operator's screen."""

    def format(self, record: logging.LogRecord) -> str:
        exc = record.exc_info[1] if record.exc_info else None
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            line = super().format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved
        if exc is not None:
            line += f" ({type(exc).__name__}: {' '.join(str(exc).split())})"
        return line


class Guarded(click.Group):
    """A click group whose commands never end in a traceback (see the module docstring)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            # click would print "Aborted!" and exit 1, the code of a failure; a command that saves
            # what can be resumed catches it first and says so.
            raise CommandError("interrupted", Exit.INTERRUPTED) from None
        except Exception as exc:  # noqa: BLE001 - the point: one line per failure, by kind
            from streams.security import redact, secret_values

            settings = ctx.obj if isinstance(ctx.obj, Settings) else None
            secrets = secret_values(settings) if settings else []  # no secret value in the one line
            known = explain(exc, settings)
            if known is not None:
                log.debug("command failed", exc_info=True)
                raise CommandError(redact(known[0], secrets), known[1]) from exc
            if logging.getLogger().isEnabledFor(logging.DEBUG):
                raise
            raise CommandError(
                redact(
                    f"unexpected {type(exc).__name__}: {exc} (run with --log-level debug for the traceback)", secrets
                )
            ) from exc
