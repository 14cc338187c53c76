"""Periodic drift audit: a worker timer (off by default) that audits worlds against prod and exports
their drift, staleness and blocking checks.

Every ``CAUSEWAY_PUBLISH_AUDIT_INTERVAL_S`` seconds (0: off), the worlds that have a pending plan
(last audit eligible, not published) or whose head is older than ``CAUSEWAY_PUBLISH_AUDIT_MIN_AGE_S``
are audited into the prod world (:func:`due`, pure), and the gauges are set from the records and the
audit log (:func:`gauge_values`, pure). Audits run in a thread: pyiceberg and the Nessie client are
synchronous.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from monitoring.publish_metrics import PublishGauges
from streams.settings import Settings
from worlds.publish import AuditRecord, BranchState, Check

log = logging.getLogger(__name__)
AUDITOR = "drift-timer"


@dataclass(frozen=True)
class WorldHead:
    world: str
    changed: datetime | None  # commit time of the head


def due(heads: list[WorldHead], states: Mapping[str, BranchState], now: datetime, min_age_s: float) -> list[str]:
    """Worlds to audit now: a pending plan (eligible, not yet published) or a head older than ``min_age_s``."""
    out = []
    for h in heads:
        st = states.get(h.world)
        pending = st is not None and st.last_verdict == "eligible" and st.outcome != "published"
        old = h.changed is not None and (now - h.changed).total_seconds() >= min_age_s
        if pending or old:
            out.append(h.world)
    return sorted(out)


def gauge_values(
    record: AuditRecord, changed: datetime | None, state: BranchState | None, now: datetime
) -> dict[str, Any]:
    """The series of one world: drift, staleness, blocked per check, last publish failed."""
    return {
        "drift": record.observed.drift,
        "staleness": max(0.0, (now - changed).total_seconds()) if changed else 0.0,
        "blocked": {str(c): int(str(c) in record.blocked_by) for c in Check},
        "failed": int(state is not None and state.outcome == "failed"),
    }


def audit_once(
    settings: Settings, gauges: PublishGauges, now: datetime | None = None, *, only: str | None = None
) -> list[str]:
    """One timer round (blocking): audit the due worlds into prod and set their gauges.

    ``only``: audit just the worlds whose name contains it (tests on a shared Nessie)."""
    from worlds.api import Worlds
    from worlds.publish_run import Publisher

    now = now or datetime.now(UTC)
    done = []
    with Worlds.from_settings(settings) as api:
        gate = Publisher(api)
        states = gate.status()
        heads = []
        for ref in api.client.list_references():
            world = api.naming.world(ref.name)
            if ref.type != "BRANCH" or world is None or world == settings.prod_world:
                continue
            if only is not None and only not in world:
                continue
            heads.append(WorldHead(world, api._commit_time(ref.pinned)))  # noqa: SLF001
        for world in due(heads, states, now, settings.publish_audit_min_age_s):
            try:
                record = gate.audit(world, settings.prod_world, by=AUDITOR, notify=False)
            except Exception as exc:  # one world's failure never stops the timer
                log.warning("drift audit of %s failed: %s", world, exc)
                continue
            changed = next((h.changed for h in heads if h.world == world), None)
            unpublished = str(record.verdict) != "up-to-date"
            gauges.set(world, gauge_values(record, changed, gate.status().get(world), now), unpublished)
            done.append(world)
    return done


def attach(app: Any, settings: Settings, registry: CollectorRegistry) -> PublishGauges | None:
    """Run the drift audit inside a Faust worker when ``publish_audit_interval_s`` > 0."""
    if settings.publish_audit_interval_s <= 0:
        return None
    gauges = PublishGauges(registry)

    @app.task
    async def publish_drift_audit() -> None:
        while not app.should_stop:
            await asyncio.sleep(settings.publish_audit_interval_s)
            try:
                await asyncio.to_thread(audit_once, settings, gauges)
            except Exception as exc:  # Nessie down: try again next round
                log.warning("drift audit round failed: %s", exc)

    return gauges
