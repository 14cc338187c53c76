"""The API's audit log: one JSON line per mutating call (who, what, which world, key, result).

Only the token's *name* is written, never the token. Denied and unauthenticated writes are logged
too (who is ``-`` when no valid token was sent).
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import orjson


class AuditLog:
    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(
        self, who: str, method: str, world: str | None, key: str, code: str, message: str, replayed: bool = False
    ) -> None:
        if self.path is None:
            return
        line = orjson.dumps(
            {
                "time": datetime.now(UTC).isoformat(),
                "who": who,
                "method": method,
                "world": world,
                "idempotency_key": key,
                "result": code,
                "message": message[:500],
                "replayed": replayed,
            }
        )
        with self._lock, self.path.open("ab") as f:
            f.write(line + b"\n")
