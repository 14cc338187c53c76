"""Reconciliation's decisions (pure): count checkpoints, the log fold, the comparison, the scope, the verdict.

The I/O twin is ``agents/reconcile.py`` (branch reads, the repair commit, the timer, Redis).

Per world and object type, at one branch head: **control** (the latest count checkpoint),
**projection** (live rows of ``entity_common``), **log** (live objects folded from ``entity_events``).
A projection row agrees with the log when it was written by the event the log says (version,
deleted flag, event id) *and* holds that event's properties (compared by digest, then by content).
"""

from __future__ import annotations

import fnmatch
import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from models.errors import OperatorError
from models.events import ChangeType, Invalid
from models.worlds import InvalidWorldId, validate_world_id
from monitoring.metrics import ReconcileOutcome

Key = tuple[str, str]  # (object_type, object_pk)


# --- the count checkpoint contract ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ControlCount:
    """One checkpoint: the control plane's live object count of a type in a world, as of a time."""

    world_id: str
    object_type: str
    count: int
    as_of_ms: int

    @property
    def key(self) -> bytes:
        return f"{self.world_id}::{self.object_type}".encode()

    def encode(self) -> bytes:
        return orjson.dumps(
            {"world_id": self.world_id, "object_type": self.object_type, "count": self.count, "as_of": self.as_of_ms}
        )


def decode_count(value: bytes | None) -> ControlCount | Invalid:
    """Decode a count checkpoint; never raises on bad input."""
    try:
        doc = orjson.loads(value or b"")
        world = validate_world_id(doc["world_id"])
        otype, count, as_of = doc["object_type"], doc["count"], doc.get("as_of", 0)
    except (orjson.JSONDecodeError, KeyError, TypeError, InvalidWorldId) as exc:
        return Invalid("bad-count", f"not a count checkpoint: {exc}")
    if not isinstance(otype, str) or not otype:
        return Invalid("bad-count", "'object_type' must be a non-empty string")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return Invalid("bad-count", "'count' must be an integer >= 0")
    if isinstance(as_of, bool) or not isinstance(as_of, int):
        return Invalid("bad-count", "'as_of' must be epoch milliseconds")
    return ControlCount(world, otype, count, as_of)


def latest_counts(checkpoints: Iterable[ControlCount]) -> dict[str, dict[str, int]]:
    """The newest checkpoint per (world, type) → ``{world: {type: count}}`` (later wins a tie)."""
    best: dict[tuple[str, str], ControlCount] = {}
    for c in checkpoints:
        k = (c.world_id, c.object_type)
        if k not in best or c.as_of_ms >= best[k].as_of_ms:
            best[k] = c
    out: dict[str, dict[str, int]] = {}
    for (world, otype), c in best.items():
        out.setdefault(world, {})[otype] = c.count
    return out


# --- comparison -----------------------------------------------------------------------------------


def digest(properties_json: str | None) -> str | None:
    """A short digest of a row's properties JSON (both tables write it with sorted keys)."""
    if properties_json is None:
        return None
    return hashlib.blake2b(properties_json.encode(), digest_size=12).hexdigest()


@dataclass(frozen=True, slots=True)
class Row:
    """What a projection row must be: which event wrote it, and a digest of its properties."""

    version: int
    deleted: bool
    event_id: str
    props: str | None = None

    def same_writer(self, other: Row) -> bool:
        return (self.version, self.deleted, self.event_id) == (other.version, other.deleted, other.event_id)


def derive(log_rows: Iterable[Mapping[str, Any]]) -> dict[Key, Mapping[str, Any]]:
    """The log row that must have written each key's projection row, from *applied* events in commit order.

    A DELETE leaves its row (a tombstone); a TRUNCATE drops every key of its type.
    """
    out: dict[Key, Mapping[str, Any]] = {}
    for r in log_rows:
        t = r["entity_type"]
        if r["change_type"] == ChangeType.TRUNCATE.value:
            for k in [k for k in out if k[0] == t]:
                del out[k]
            continue
        out[(t, r["entity_pk"])] = r
    return out


def expected(derived: Mapping[Key, Mapping[str, Any]]) -> dict[Key, Row]:
    out = {}
    for k, r in derived.items():
        deleted = r["change_type"] == ChangeType.DELETE.value
        props = None if deleted else digest(r.get("after_properties"))
        out[k] = Row(r["version"], deleted, r["event_id"], props)
    return out


def contents_agree(projection_json: str | None, log_json: str | None) -> bool:
    """Whether a projection row holds its event's properties.

    Every property the event carried must have the event's value. The row may hold more: an
    event can name properties as unchanged (CDC), which the committer carries over from the
    previous row, and the log does not record which those were.
    """
    if projection_json == log_json:
        return True
    proj = orjson.loads(projection_json) if projection_json else {}
    log = orjson.loads(log_json) if log_json else {}
    return isinstance(proj, dict) and isinstance(log, dict) and all(k in proj and proj[k] == v for k, v in log.items())


def differences(projection: Mapping[Key, Row], wanted: Mapping[Key, Row]) -> tuple[set[Key], set[Key]]:
    """Keys whose row must be (re)written from the log (digests differ: check them with ``contents_agree``),
    and keys whose row must go."""
    write = {k for k, row in wanted.items() if projection.get(k) != row}
    remove = {k for k in projection if k not in wanted}
    return write, remove


def live_counts(rows: Mapping[Key, Row]) -> Counter[str]:
    return Counter(k[0] for k, r in rows.items() if not r.deleted)


@dataclass
class TypeReport:
    """One object type of one run."""

    object_type: str
    control: int | None
    projection: int
    log: int
    mismatched: int  # keys whose projection row differs from the log (missing, extra, other writer or contents)
    repaired: int = 0  # rows rewritten or removed (dry run: would be)

    @property
    def drift(self) -> int:
        diffs = [self.mismatched, abs(self.projection - self.log)]
        if self.control is not None:
            diffs += [abs(self.control - self.projection), abs(self.control - self.log)]
        return max(diffs)

    @property
    def unrepairable(self) -> bool:
        """The control count differs from the event log: input never reached causeway (or the
        checkpoint is ahead of the branch). Rebuilding the projection from the log cannot fix it."""
        return self.control is not None and self.control != self.log


@dataclass
class RunReport:
    """One world's run."""

    world_id: str
    outcome: ReconcileOutcome = "ok"
    types: dict[str, TypeReport] = field(default_factory=dict)
    commit: str | None = None
    head: str | None = None
    seconds: float = 0.0
    dry_run: bool = False
    error: str | None = None
    finished_at: float = 0.0  # Unix time

    @property
    def drift(self) -> dict[str, int]:
        return {t: r.drift for t, r in self.types.items()}

    def to_json(self) -> dict[str, Any]:
        return {
            "world": self.world_id,
            "outcome": self.outcome,
            "dry_run": self.dry_run,
            "commit": self.commit,
            "head": self.head,
            "seconds": round(self.seconds, 3),
            "error": self.error,
            "types": {
                t: {
                    "control": r.control,
                    "projection": r.projection,
                    "log": r.log,
                    "mismatched": r.mismatched,
                    "drift": r.drift,
                    "repaired": r.repaired,
                    "unrepairable": r.unrepairable,
                }
                for t, r in self.types.items()
            },
        }


def compare(
    projection: Mapping[Key, Row],
    wanted: Mapping[Key, Row],
    control: Mapping[str, int],
    threshold: int,
    live: tuple[Mapping[str, int], Mapping[str, int]] | None = None,
) -> tuple[dict[str, TypeReport], set[Key], set[Key]]:
    """Per-type reports, and the keys to write / remove for the types whose drift passes ``threshold``.

    ``projection`` and ``wanted`` must already agree on keys whose contents agree (see
    ``contents_agree``): a differing digest here counts as a mismatch. ``live`` (projection, log)
    are the world's live counts per type when the two mappings hold only the keys that differ.
    """
    write, remove = differences(projection, wanted)
    proj_live, log_live = live or (live_counts(projection), live_counts(wanted))
    mismatched = Counter(k[0] for k in write | remove)
    types = sorted(set(proj_live) | set(log_live) | set(control) | set(mismatched))
    reports = {
        t: TypeReport(t, control.get(t), proj_live.get(t, 0), log_live.get(t, 0), mismatched.get(t, 0)) for t in types
    }
    over = {t for t, r in reports.items() if r.drift > threshold and r.mismatched}
    return reports, {k for k in write if k[0] in over}, {k for k in remove if k[0] in over}


# --- which worlds a pass covers -------------------------------------------------------------------


class ScopeError(OperatorError, ValueError):
    """``CAUSEWAY_RECONCILE_WORLDS`` holds a term that is neither ``served``, a world id nor a pattern."""


SERVED = "served"


@dataclass(frozen=True)
class WorldScope:
    """The worlds a reconciliation pass covers (``Settings.reconcile_worlds``).

    Terms, comma-separated: ``served`` (the worlds this worker applied events for since it started),
    a world id, or a glob pattern (``team-a-*``; ``*`` is every world branch in Nessie).
    """

    served: bool
    patterns: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> WorldScope:
        terms = [t.strip() for t in text.split(",") if t.strip()]
        patterns: list[str] = []
        for t in terms:
            if t == SERVED:
                continue
            probe = t.replace("*", "x").replace("?", "x")
            try:
                validate_world_id(probe)
            except InvalidWorldId as exc:
                raise ScopeError(f"CAUSEWAY_RECONCILE_WORLDS: {t!r} is not a world id or pattern ({exc})") from None
            patterns.append(t)
        return cls(SERVED in terms, tuple(patterns))

    @property
    def empty_without_worker(self) -> bool:
        """Only ``served``: outside a worker (the CLI) the scope selects nothing."""
        return not self.patterns

    def select(self, worlds: Iterable[str], served: Iterable[str] = ()) -> list[str]:
        """The worlds of ``worlds`` (branches that exist) this scope covers, sorted."""
        mine = set(served) if self.served else set()
        return sorted(w for w in set(worlds) if w in mine or any(fnmatch.fnmatchcase(w, p) for p in self.patterns))


# --- the verdict of a run (CLI summary and exit code) ---------------------------------------------

# The project's exit codes (docs/operations.md): 0 done, 1 error, 2 usage, 3 incomplete or differs,
# 4 a service down (the CLI's preflight); 5 is reconcile's own verdict.
ExitCode = Literal[0, 1, 3, 5]
EXIT_CONSISTENT: ExitCode = 0  # nothing found, or everything found was repaired (or is within the threshold)
EXIT_FAILED: ExitCode = 1  # a world could not be reconciled (a service failed mid-run, gave up after conflicts)
EXIT_WOULD_REPAIR: ExitCode = 3  # dry run: rows differ from the log; a real run would rebuild them
EXIT_UNREPAIRABLE: ExitCode = 5  # drift a rebuild cannot fix: control count ≠ event log


@dataclass
class Verdict:
    """What a CLI run found, repaired and left, and the exit code that says which."""

    worlds: int = 0
    consistent: list[str] = field(default_factory=list)
    repaired: dict[str, int] = field(default_factory=dict)  # world -> rows rebuilt
    would_repair: dict[str, int] = field(default_factory=dict)  # dry run: world -> rows
    tolerated: dict[str, int] = field(default_factory=dict)  # world -> rows within the threshold
    unrepairable: list[tuple[str, TypeReport]] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def exit_code(self) -> ExitCode:
        if self.failed:
            return EXIT_FAILED
        if self.unrepairable:
            return EXIT_UNREPAIRABLE
        if self.would_repair:
            return EXIT_WOULD_REPAIR
        return EXIT_CONSISTENT

    def rows(self) -> list[tuple[str, str]]:
        """The summary block's rows: what was found, repaired, left and why, and the exit code."""
        out = [("worlds", str(self.worlds)), ("consistent", str(len(self.consistent)))]
        if self.repaired:
            out.append(("repaired", f"{sum(self.repaired.values())} row(s) in {len(self.repaired)} world(s)"))
        if self.would_repair:
            n = sum(self.would_repair.values())
            out.append(("would repair", f"{n} row(s) in {len(self.would_repair)} world(s) (dry run: nothing written)"))
        if self.tolerated:
            n = sum(self.tolerated.values())
            out.append(("within threshold", f"{n} row(s) in {len(self.tolerated)} world(s) left as they are"))
        for world, t in self.unrepairable:
            out.append((
                "cannot repair",
                f"{world}/{t.object_type}: control count {t.control}, event log {t.log}: the input never reached "
                "causeway (or the checkpoint is ahead of the branch); a rebuild cannot fix it: replay the missing "
                "events or correct the checkpoint",
            ))  # fmt: skip
        for world, error in self.failed.items():
            out.append(("failed", f"{world}: {error}"))
        meaning = {
            EXIT_CONSISTENT: "consistent",
            EXIT_FAILED: "some worlds failed",
            EXIT_UNREPAIRABLE: "drift a rebuild cannot fix",
            EXIT_WOULD_REPAIR: "dry run found rows to repair",
        }
        out.append(("exit code", f"{self.exit_code} ({meaning[self.exit_code]})"))
        return out


def verdict(reports: Iterable[RunReport], threshold: int) -> Verdict:
    v = Verdict()
    for r in reports:
        v.worlds += 1
        if r.outcome == "failed":
            v.failed[r.world_id] = r.error or "failed"
            continue
        rows = sum(t.repaired for t in r.types.values())
        if rows:
            (v.would_repair if r.dry_run else v.repaired)[r.world_id] = rows
        pending = sum(t.mismatched for t in r.types.values() if not t.repaired)
        if pending and threshold:
            v.tolerated[r.world_id] = pending
        bad = [t for t in r.types.values() if t.unrepairable and t.drift > threshold]
        v.unrepairable += [(r.world_id, t) for t in bad]
        if not rows and not bad and not (pending and threshold):
            v.consistent.append(r.world_id)
    return v
