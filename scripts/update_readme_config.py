"""Regenerate the README's configuration table from streams/settings.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from streams.settings import markdown_table  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- config-table:start -->", "<!-- config-table:end -->"


def render(text: str) -> str:
    block = f"{START}\n{markdown_table()}\n{END}"
    return re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)


if __name__ == "__main__":
    README.write_text(render(README.read_text()))
