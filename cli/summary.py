"""The ``--- title (time) ---`` summary block every command ends with, to paste into a ticket."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import click


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def summary(title: str, rows: Sequence[tuple[str, object]]) -> None:
    """Print ``--- title ---`` and the rows as aligned ``key  value`` lines."""
    click.echo(f"--- {title} ---")
    width = max(len(k) for k, _ in rows) if rows else 0
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")
