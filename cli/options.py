"""Options and option values shared by the operator commands (replay, dlq, offsets): counts and
durations that cannot go below zero, times, and the default topics."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

from streams.settings import Settings

F = TypeVar("F", bound=Callable[..., Any])


def not_negative(*decls: str, default: float, help: str) -> Callable[[F], F]:
    """An option whose default ``--help`` shows and that refuses a value below 0.

    An ``int`` default makes it a count (``--limit``, ``--show``), a ``float`` one a duration in seconds.
    """
    kind = click.IntRange(min=0) if isinstance(default, int) else click.FloatRange(min=0)
    return click.option(*decls, default=default, show_default=True, type=kind, help=help)


def parse_time(value: str | None) -> int | None:
    """Epoch milliseconds from epoch ms digits or ISO-8601 (naive = UTC)."""
    if value is None:
        return None
    if value.isdigit():
        return int(value)
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is neither ISO-8601 nor epoch milliseconds") from exc
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def iso_ms(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def change_topics(settings: Settings, topics: Sequence[str]) -> tuple[str, ...]:
    """The topics given, or both change topics."""
    return tuple(topics) or (settings.objects_topic, settings.links_topic)
