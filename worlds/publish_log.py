"""The WAP gate's durable audit log: one Nessie commit per entry on a dedicated branch.

Each audit, approval and run outcome is a commit on ``CAUSEWAY_PUBLISH_LOG_BRANCH`` (default
``causeway-publish-log``) whose properties hold the entry as JSON (``causeway.publish.entry``) plus
its kind and plan id, so the log is durable, append-only, atomic and readable with a CEL filter
(``causeway publish status`` folds it). The commit carries one ``UNCHANGED`` operation on a key
no table uses (Nessie refuses an empty commit); concurrent appends can conflict (the key does not
exist, so Nessie cannot rebase the op), and an append goes through the write path's commit loop
(``sinks.occ.commit_operations``: a fresh head, jittered backoff, an unknown outcome looked up by
the append's ``causeway.write_id`` so an entry is never logged twice); the branch is kept apart
from ``main`` so logging never moves a head the gate compares.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

import orjson

from sinks.errors import BranchMissing, NessieConflict, NessieNotFound
from sinks.nessie import Operation, Reference, SyncNessieClient
from sinks.occ import Prepared, RetryPolicy, commit_operations

PROP_KIND = "causeway.publish.kind"
PROP_PLAN = "causeway.publish.plan"
PROP_ENTRY = "causeway.publish.entry"
LOG_KEY = ("causeway-publish-log",)
#: Appends tried before RetriesExhausted is raised (each re-reads the head; the commit holds no data to redo).
APPEND_ATTEMPTS = 20
#: Concurrent appends conflict often (the op cannot be rebased), and only on each other: short pauses.
APPEND_POLICY = RetryPolicy(APPEND_ATTEMPTS - 1, backoff_s=0.02, cap_s=1.0)


class PublishLog:
    """Append and read entries; the branch is created on first append."""

    def __init__(self, client: SyncNessieClient, branch: str, author: str = "causeway") -> None:
        self.client = client
        self.branch = branch
        self.author = author

    def _head(self) -> Reference:
        try:
            return self.client.get_reference(self.branch)
        except NessieNotFound:
            try:
                # from the repository's root commit: the log starts empty, not as a copy of main's history
                cfg = self.client.config()
                root = Reference(cfg.default_branch, "BRANCH", cfg.no_ancestor_hash)
                return self.client.create_branch(self.branch, root)
            except NessieConflict:  # another process created it meanwhile
                return self.client.get_reference(self.branch)

    def append(self, entry: Mapping[str, Any]) -> str:
        """Write one entry (``kind`` and ``plan_id`` required); returns the log commit hash.

        Raises RetriesExhausted (a NessieConflict) when every attempt met a concurrent append.
        """
        kind, plan = str(entry["kind"]), str(entry["plan_id"])
        props = {PROP_KIND: kind, PROP_PLAN: plan, PROP_ENTRY: orjson.dumps(entry).decode()}
        prepared = Prepared([Operation("UNCHANGED", LOG_KEY)], f"publish {kind} {plan}", props)
        cid = uuid.uuid4().hex  # one id for every attempt: "did it land?" looks for it
        for _ in range(2):
            try:
                done = commit_operations(
                    self.client,
                    self.branch,
                    lambda base, n: prepared,
                    policy=APPEND_POLICY,
                    what=f"publish log append ({kind} {plan})",
                    author=self.author,
                    commit_id=cid,
                )
            except BranchMissing:
                self._head()  # the first append creates the log branch
                continue
            assert done.hash is not None
            return done.hash
        raise BranchMissing(f"publish log branch {self.branch} vanished while appending")

    def entries(self, plan_id: str | None = None) -> list[dict[str, Any]]:
        """Entries oldest first, all or one plan's."""
        flt = f"'{PROP_ENTRY}' in commit.properties"
        if plan_id is not None:
            if not plan_id.replace("-", "").isalnum():
                return []
            flt += f" && '{PROP_PLAN}' in commit.properties && commit.properties['{PROP_PLAN}'] == '{plan_id}'"
        try:
            found = list(self.client.history_entries(self.branch, max_records=500, filter=flt))
        except NessieNotFound:
            return []
        out = []
        for e in reversed(found):
            doc = orjson.loads(e.properties[PROP_ENTRY])
            doc.setdefault("log_commit", e.hash)
            out.append(doc)
        return out
