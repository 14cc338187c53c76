"""Prometheus file-based service discovery that follows the running processes.

Each worker (kind ``worker``) and lag exporter (kind ``lag-exporter``) writes one JSON file into the
discovery folder (``CAUSEWAY_PROMETHEUS_SD_DIR``) when it starts serving ``/metrics`` and removes it
when it stops. Prometheus (``file_sd_configs``, one job per kind) re-reads the folder on change, so
``up{job="causeway"}`` has exactly one series per running worker: no target without a worker, and
``absent(up{job="causeway"})`` fires when none runs.

A worker killed with SIGKILL cannot remove its file: its target stays and ``CausewayWorkerDown`` fires,
which is right (it died without stopping). The next process of the same kind on the same host removes
files whose process no longer exists, as a restarted worker takes the dead one's place.

File format (Prometheus's): ``[{"targets": ["host:port"], "labels": {...}}]``; ``labels`` carry the
``process`` (host-pid: a restarted process on the same port is a new series), and the file name
carries kind, host and pid (``<kind>-<host>-<pid>.json``).
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

KINDS = ("worker", "lag-exporter")


def advertised_address(bind: str, port: int) -> str:
    """The ``host:port`` Prometheus should scrape for a server bound to ``bind``."""
    host = "127.0.0.1" if bind in ("", "0.0.0.0", "::", "127.0.0.1", "localhost") else bind
    return f"{host}:{port}"


def entry_name(kind: str, host: str, pid: int) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown discovery kind {kind!r}; expected one of {', '.join(KINDS)}")
    safe_host = "".join(c if c.isalnum() or c in "-." else "_" for c in host)
    return f"{kind}-{safe_host}-{pid}.json"


def entry(target: str, labels: Mapping[str, str]) -> list[dict[str, object]]:
    """One target group in Prometheus's file_sd format."""
    return [{"targets": [target], "labels": dict(labels)}]


def stale_entries(names: list[str], kind: str, host: str, alive: Callable[[int], bool]) -> list[str]:
    """Files of ``kind`` on ``host`` whose process is gone (pure: ``alive`` answers for a pid)."""
    prefix = entry_name(kind, host, 0)[: -len("0.json")]
    out = []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".json")):
            continue
        pid = name[len(prefix) : -len(".json")]
        if pid.isdigit() and not alive(int(pid)):
            out.append(name)
    return out


def pid_alive(pid: int) -> bool:
    """Is a process with this pid running on this host (one we may not signal counts as running)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def register(sd_dir: str, kind: str, target: str, labels: Mapping[str, str] | None = None) -> Path | None:
    """Write this process's discovery file (atomically); returns its path, or None when disabled.

    Never raises for an unwritable folder: discovery must not stop a worker (the failure is logged,
    and the missing target shows as ``CausewayWorkersAbsent``).
    """
    if not sd_dir:
        return None
    host, pid = socket.gethostname(), os.getpid()
    folder = Path(sd_dir)
    path = folder / entry_name(kind, host, pid)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name in stale_entries(sorted(p.name for p in folder.iterdir()), kind, host, pid_alive):
            (folder / name).unlink(missing_ok=True)
        tmp = path.with_suffix(".tmp")  # Prometheus reads *.json only: never a half-written file
        tmp.write_text(json.dumps(entry(target, {"process": f"{host}-{pid}", **(labels or {})})))
        os.replace(tmp, path)
    except OSError as exc:
        log.warning("Prometheus discovery: cannot write %s: %s", path, exc)
        return None
    return path


def unregister(path: Path | None) -> None:
    """Remove a discovery file written by ``register`` (no error if it is gone)."""
    if path is None:
        return
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("Prometheus discovery: cannot remove %s: %s", path, exc)


@contextmanager
def registered(sd_dir: str, kind: str, target: str, labels: Mapping[str, str] | None = None) -> Iterator[Path | None]:
    """``register`` for the duration of a ``with`` block (a process's serving life), then ``unregister``."""
    path = register(sd_dir, kind, target, labels)
    try:
        yield path
    finally:
        unregister(path)


def describe_targets(up_series: list[dict[str, Any]]) -> str:
    """One line on Prometheus's ``up`` answer: how many targets answer, and the causeway workers.

    ``up_series`` is the ``result`` list of an instant query of ``up``. With discovery, a worker target
    exists only while a worker runs, so "no worker running" is said plainly instead of "1/7 up".
    """

    def is_up(s: dict[str, Any]) -> bool:
        return bool(s["value"][1] == "1")

    workers = [s for s in up_series if s["metric"].get("job") == "causeway"]
    exporters = [s for s in up_series if s["metric"].get("job") == "causeway-lag"]
    line = f"{sum(map(is_up, up_series))}/{len(up_series)} targets up"
    if workers:
        line += f"; workers: {sum(map(is_up, workers))}/{len(workers)} up"
    else:
        line += "; no worker running (none discovered)"
    if not any(map(is_up, exporters)):
        line += "; lag exporter not scraped"
    return line
