"""The one optimistic-concurrency commit loop of the write path.

Every writer of a world branch (the batch committer, schema sync, reconciliation, table evolution,
rebuild, merge) commits the same way: pin the branch head ``H`` (``begin``), stage its table changes
against ``H``, publish them as one Nessie commit *expecting* ``H``, and on failure retry by kind:

* ``NessieConflict`` (another writer moved the branch or a touched key): jittered exponential
  backoff, then a fresh attempt that reads the new head and decides again;
* ``CommitStateUnknown`` (sent, no answer): the commit may have landed. Before every later attempt,
  and once more when giving up, the branch history since the first attempt's base is searched for
  the commit carrying the writer's *commit id* (``causeway.batch_id``); if it is there, the outcome
  is built from it and nothing is committed twice. A writer without a lookup re-plans instead
  (its attempt must then be idempotent: it finds its own change on the new head);
* anything else (bad request, missing branch, unreachable Nessie) is not retried here.

After ``policy.retries`` retries :class:`RetriesExhausted` is raised (one type for every writer).
A ``NessieNotFound`` from ``begin`` becomes :class:`BranchMissing` so callers can tell "the world's
branch is gone" from a missing table or commit.

:func:`commit_loop` is the policy alone, over injected ``open``/``attempt``/``lookup``/``sleep``
callables (tested in milliseconds with fakes); :class:`Occ` binds it to a Nessie client and catalog.
:func:`commit_operations` binds it to a client alone, for writers whose commit is a list of prepared
Nessie operations rather than staged pyiceberg updates (a rollback's restored table pointers, a
release marker, a publish-log entry); their commit id rides in ``causeway.write_id``.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from pyiceberg.typedef import Identifier

from sinks.catalog import NessieCatalog
from sinks.errors import BranchMissing, CommitStateUnknown, NessieConflict, NessieNotFound, RetriesExhausted
from sinks.nessie import Operation, SyncNessieClient
from streams.settings import Settings

log = logging.getLogger(__name__)

#: The commit property that carries a writer's commit id (batch id, ``schema:<id>``, ``reconcile:<id>``...).
PROP_COMMIT_ID = "causeway.batch_id"
#: The commit id of a writer whose commits are not event batches (rollback, release marker, publish
#: log): history readers count every ``causeway.batch_id`` as an event batch, so these use their own.
PROP_WRITE_ID = "causeway.write_id"

T = TypeVar("T")


class Session(Protocol):
    """What an attempt commits through: a catalog that pins a head and stages until published."""

    def begin(self) -> str: ...

    def discard(self) -> None: ...


S = TypeVar("S", bound=Session)


@dataclass(frozen=True)
class RetryPolicy:
    """How many retries, and the full-jitter exponential backoff between them."""

    retries: int = 8
    backoff_s: float = 0.05
    cap_s: float = 5.0

    def delay(self, attempt: int, uniform: Callable[[float, float], float] = random.uniform) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based): uniform(0, min(cap, base·2^(n-1)))."""
        return uniform(0.0, min(self.cap_s, self.backoff_s * 2 ** (attempt - 1)))


def commit_loop(
    open_session: Callable[[], S],
    attempt: Callable[[S, str, int], T],
    *,
    policy: RetryPolicy,
    what: str,
    lookup: Callable[[str | None], str | None] | None = None,
    landed: Callable[[str, int], T] | None = None,
    on_retry: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    uniform: Callable[[float, float], float] = random.uniform,
) -> T:
    """Run ``attempt(session, base, n)`` until it returns, retrying conflicts and unknown outcomes.

    ``lookup(since)`` answers "did it land?": the hash of the commit carrying this writer's commit id
    that is newer than ``since``, or None; ``landed(hash, attempts)`` turns a found commit into the
    writer's result. ``on_retry(reason)`` (``conflict`` / ``unknown_state``) is called before each
    backoff. The session is discarded after every attempt, whatever happened.

    Raises RetriesExhausted after ``policy.retries`` retries, BranchMissing when the branch does not
    exist, and any other error of an attempt unchanged.
    """
    if (lookup is None) != (landed is None):
        raise ValueError("lookup and landed go together")
    last: Exception | None = None
    first_base: str | None = None  # commits of this loop can only be newer than this
    unknown = False
    for n in range(1, policy.retries + 2):
        if unknown and lookup is not None and landed is not None:
            # An earlier attempt's outcome was unknown: it may land late, so look again before
            # every retry (back to the first attempt's base), not only right after the failure.
            found = lookup(first_base)
            if found is not None:
                log.warning("%s: found landed as %s", what, found)
                return landed(found, n - 1)
        session = open_session()
        try:
            try:
                base = session.begin()
            except NessieNotFound as exc:
                raise BranchMissing(f"{what}: {exc}", status=exc.status, error_code=exc.error_code) from exc
            first_base = first_base or base
            return attempt(session, base, n)
        except NessieConflict as exc:
            last = exc
            log.info("%s: conflict (attempt %d): %s", what, n, exc)
            reason = "conflict"
        except CommitStateUnknown as exc:
            last, unknown = exc, True
            log.warning("%s: commit outcome unknown (attempt %d)", what, n)
            reason = "unknown_state"
        finally:
            session.discard()
        if n <= policy.retries:
            if on_retry is not None:
                on_retry(reason)
            sleep(policy.delay(n, uniform))
    if unknown and lookup is not None and landed is not None:
        found = lookup(first_base)
        if found is not None:
            return landed(found, policy.retries + 1)
    raise RetriesExhausted(f"{what}: gave up after {policy.retries + 1} attempts: {last}") from last


def find_commit(
    client: SyncNessieClient,
    branch: str,
    commit_id: str,
    *,
    since: str | None = None,
    max_records: int = 2000,
    id_property: str = PROP_COMMIT_ID,
) -> str | None:
    """The hash of the commit on ``branch`` whose ``id_property`` (``causeway.batch_id``) is ``commit_id``.

    Walks history newest first and stops at ``since`` (the base of the first attempt: a commit of
    the loop can only be newer) or after ``max_records`` commits.
    """
    seen = 0
    for page in client.history(branch, max_records=min(max_records, 200)):
        for entry in page:
            if entry.hash == since:
                return None
            if entry.properties.get(id_property) == commit_id:
                return entry.hash
            seen += 1
            if seen >= max_records:
                return None
    return None


class Occ:
    """:func:`commit_loop` bound to one Nessie client: catalogs per branch, lookups by commit id."""

    def __init__(
        self,
        client: SyncNessieClient,
        catalog: NessieCatalog,
        policy: RetryPolicy,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.client = client
        self.policy = policy
        self.sleep = sleep
        self._template = catalog

    @classmethod
    def from_settings(cls, settings: Settings, client: SyncNessieClient | None = None) -> Occ:
        client = client or SyncNessieClient.from_settings(settings)
        catalog = NessieCatalog.from_settings(settings, settings.main_branch, client=client)
        return cls(client, catalog, RetryPolicy(settings.commit_retries, settings.commit_backoff_s))

    def catalog(self, branch: str) -> NessieCatalog:
        """A fresh catalog on ``branch`` (``branch@hash`` reads a fixed commit)."""
        return self._template.at(branch)

    def run(
        self,
        branch: str,
        attempt: Callable[[NessieCatalog, str, int], T],
        *,
        what: str,
        commit_id: str | None = None,
        landed: Callable[[str, int], T] | None = None,
        on_retry: Callable[[str], None] | None = None,
        id_property: str = PROP_COMMIT_ID,
        reads: Sequence[Identifier] = (),
    ) -> T:
        """Commit to ``branch`` through :func:`commit_loop`; ``commit_id`` + ``landed`` enable the lookup.

        ``id_property``: the commit property that carries ``commit_id`` (a batch id by default).
        ``reads``: tables every attempt reads, fetched with the head in one round trip
        (:meth:`NessieCatalog.reading`).
        """
        lookup: Callable[[str | None], str | None] | None = None
        if landed is not None:
            if commit_id is None:
                raise ValueError("a landed outcome needs the commit id to look for")
            cid = commit_id

            def lookup(since: str | None) -> str | None:
                return find_commit(self.client, branch, cid, since=since, id_property=id_property)

        return commit_loop(
            lambda: self.catalog(branch).reading(reads),
            attempt,
            policy=self.policy,
            what=what,
            lookup=lookup,
            landed=landed,
            on_retry=on_retry,
            sleep=self.sleep,
        )


@dataclass(frozen=True)
class Prepared:
    """One commit of prepared Nessie operations, decided against the head an attempt pinned."""

    operations: Sequence[Operation]
    message: str
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Committed:
    """Where an operations commit landed (None: ``prepare`` found nothing to do) after how many attempts."""

    hash: str | None
    attempts: int


class _Head:
    """The session of an operations commit: pins the branch head; nothing is staged, nothing to discard."""

    def __init__(self, client: SyncNessieClient, branch: str) -> None:
        self.client, self.branch = client, branch

    def begin(self) -> str:
        return self.client.get_reference(self.branch).hash

    def discard(self) -> None:
        pass


def commit_operations(
    client: SyncNessieClient,
    branch: str,
    prepare: Callable[[str, int], Prepared | None],
    *,
    policy: RetryPolicy,
    what: str,
    author: str,
    commit_id: str | None = None,
    on_retry: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Committed:
    """Commit ``prepare(base, attempt)``'s operations on ``branch`` expecting ``base``, through :func:`commit_loop`.

    ``prepare`` decides against the pinned head ``base`` on every attempt (None: nothing to commit).
    ``commit_id`` (a fresh uuid by default) is written as ``causeway.write_id`` and searched for
    when an outcome is unknown, so a commit that landed is never made twice.
    """
    cid = commit_id or uuid.uuid4().hex

    def attempt(session: _Head, base: str, n: int) -> Committed:
        prepared = prepare(base, n)
        if prepared is None:
            return Committed(None, n)
        result = client.commit(
            branch,
            base,
            list(prepared.operations),
            message=prepared.message,
            author=author,
            properties={**prepared.properties, PROP_WRITE_ID: cid},
        )
        return Committed(result.hash, n)

    def lookup(since: str | None) -> str | None:
        return find_commit(client, branch, cid, since=since, id_property=PROP_WRITE_ID)

    return commit_loop(
        lambda: _Head(client, branch),
        attempt,
        policy=policy,
        what=what,
        lookup=lookup,
        landed=Committed,
        on_retry=on_retry,
        sleep=sleep,
    )
