"""How a benchmark probe inside a worker keeps its JSON file current: rewritten whole every few
seconds and once more at exit, through a temporary file so that a reader never sees half of one
(a SIGKILLed worker leaves the last complete write)."""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def write_json(path: str, doc: Any) -> None:
    """Replace ``path`` with ``doc`` as JSON in one rename."""
    tmp = f"{path}.tmp"
    Path(tmp).write_text(json.dumps(doc))
    os.replace(tmp, path)


def keep_written(path: str, state: Callable[[], Any], every: float, name: str) -> None:
    """Write ``state()`` to ``path`` every ``every`` seconds from a daemon thread, and at exit."""

    def dump() -> None:
        write_json(path, state())

    def loop() -> None:
        while True:
            time.sleep(every)
            dump()

    threading.Thread(target=loop, name=name, daemon=True).start()
    atexit.register(dump)
