"""The WAP gate's durable audit log: one Nessie commit per entry on a dedicated branch.

Each audit, approval and run outcome is a commit on ``CAUSEWAY_PUBLISH_LOG_BRANCH`` (default
``causeway-publish-log``) whose properties hold the entry as JSON (``causeway.publish.entry``) plus
its kind and plan id, so the log is durable, append-only, atomic and readable with a CEL filter
(``causeway publish status`` folds it). The commit carries one ``UNCHANGED`` operation on a key
no table uses (Nessie refuses an empty commit); concurrent appends can conflict (the key does not
exist, so Nessie cannot rebase the op), and an append re-reads the head and retries; the
branch is kept apart from ``main`` so logging never moves a head the gate compares.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from sinks.errors import NessieConflict, NessieNotFound
from sinks.nessie import Operation, Reference, SyncNessieClient

PROP_KIND = "causeway.publish.kind"
PROP_PLAN = "causeway.publish.plan"
PROP_ENTRY = "causeway.publish.entry"
LOG_KEY = ("causeway-publish-log",)
#: Appends tried before a conflict is raised (each re-reads the head; the commit holds no data to redo).
APPEND_ATTEMPTS = 20


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
        """Write one entry (``kind`` and ``plan_id`` required); returns the log commit hash."""
        kind, plan = str(entry["kind"]), str(entry["plan_id"])
        for attempt in range(APPEND_ATTEMPTS):
            try:
                result = self.client.commit(
                    self.branch,
                    self._head().hash,
                    [Operation("UNCHANGED", LOG_KEY)],
                    message=f"publish {kind} {plan}",
                    author=self.author,
                    properties={PROP_KIND: kind, PROP_PLAN: plan, PROP_ENTRY: orjson.dumps(entry).decode()},
                )
                return result.hash
            except NessieConflict:
                # Nessie refuses an UNCHANGED op on a key that does not exist when the expected hash is
                # behind (measured: 409 "Key ... does not exist"), so a concurrent append means: re-read, retry
                if attempt == APPEND_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

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
