"""Client for Project Nessie's REST API v2: references, atomic multi-table commits, history, merges.

Every endpoint is written once, in ``_Requests``, as a ``_Call``: the HTTP request plus the parser of
its answer. ``NessieClient`` (async) and ``SyncNessieClient`` (for pyiceberg's synchronous catalog)
differ only in how they send a ``_Call``; both share ``RetryPolicy`` and ``sinks.errors``.

References in read calls may be ``name``, ``name@hash``, ``name~N`` (N commits back) or
``name*<time>``. Nessie 0.99 takes the time as epoch milliseconds or ISO-8601 *with* fractional
seconds (``2026-01-15T10:00:00.000Z``); without them it answers 400. Branch names may hold '/'.
Content keys are tuples of elements: ``("onto", "entity_common")``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Concatenate, Generic, Literal, ParamSpec, Self, TypeVar
from urllib.parse import quote

import httpx
import orjson

from sinks.errors import (
    Conflict,
    ContentKey,
    NessieError,
    NessieNotAnApi,
    error_from_response,
    error_from_transport,
)
from sinks.nessie_http import KeptConnections
from streams.security import NessieAuth, nessie_http_options
from streams.settings import Settings, mask_url

log = logging.getLogger(__name__)

RefType = Literal["BRANCH", "TAG"]
MergeMode = Literal["NORMAL", "FORCE", "DROP"]

T = TypeVar("T")
E = TypeVar("E")
P = ParamSpec("P")


# --- model -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reference:
    """A branch or tag at a commit hash."""

    name: str
    type: RefType
    hash: str

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Reference:
        return cls(name=data["name"], type=data["type"], hash=data["hash"])

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "name": self.name, "hash": self.hash}

    @property
    def pinned(self) -> str:
        """``name@hash``: reads through it see exactly this commit."""
        return f"{self.name}@{self.hash}"


@dataclass(frozen=True)
class Config:
    default_branch: str
    spec_version: str
    no_ancestor_hash: str
    api_version: int


@dataclass(frozen=True)
class IcebergTable:
    """Nessie's pointer to an Iceberg table. ``id`` is None for a new key and required for an update."""

    type: ClassVar[str] = "ICEBERG_TABLE"
    metadata_location: str
    snapshot_id: int = -1
    schema_id: int = 0
    spec_id: int = 0
    sort_order_id: int = 0
    id: str | None = None

    def to_json(self) -> dict[str, Any]:
        data = {
            "type": self.type,
            "metadataLocation": self.metadata_location,
            "snapshotId": self.snapshot_id,
            "schemaId": self.schema_id,
            "specId": self.spec_id,
            "sortOrderId": self.sort_order_id,
        }
        return data | ({"id": self.id} if self.id else {})


@dataclass(frozen=True)
class Namespace:
    type: ClassVar[str] = "NAMESPACE"
    elements: ContentKey
    id: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": self.type, "elements": list(self.elements)}
        if self.properties:
            data["properties"] = dict(self.properties)
        return data | ({"id": self.id} if self.id else {})


@dataclass(frozen=True)
class OtherContent:
    """Views, Delta tables, UDFs: kept as raw JSON so they round-trip untouched."""

    type: str
    id: str | None
    raw: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.raw)


Content = IcebergTable | Namespace | OtherContent


def content_from_json(data: dict[str, Any]) -> Content:
    kind = data.get("type")
    if kind == "ICEBERG_TABLE":
        return IcebergTable(
            metadata_location=data["metadataLocation"],
            snapshot_id=data.get("snapshotId", -1),
            schema_id=data.get("schemaId", 0),
            spec_id=data.get("specId", 0),
            sort_order_id=data.get("sortOrderId", 0),
            id=data.get("id"),
        )
    if kind == "NAMESPACE":
        return Namespace(tuple(data["elements"]), data.get("id"), dict(data.get("properties") or {}))
    return OtherContent(str(kind), data.get("id"), data)


@dataclass(frozen=True)
class Operation:
    """One change in a commit: PUT a content at a key, or DELETE a key."""

    type: Literal["PUT", "DELETE", "UNCHANGED"]
    key: ContentKey
    content: Content | None = None

    @staticmethod
    def put(key: ContentKey, content: Content) -> Operation:
        return Operation("PUT", tuple(key), content)

    @staticmethod
    def put_table(
        key: ContentKey,
        metadata_location: str,
        *,
        snapshot_id: int = -1,
        schema_id: int = 0,
        spec_id: int = 0,
        sort_order_id: int = 0,
        content_id: str | None = None,
    ) -> Operation:
        """PUT a table pointer; pass the current ``content_id`` when the key already exists."""
        table = IcebergTable(metadata_location, snapshot_id, schema_id, spec_id, sort_order_id, content_id)
        return Operation.put(key, table)

    @staticmethod
    def put_namespace(key: ContentKey, properties: Mapping[str, str] | None = None) -> Operation:
        return Operation.put(key, Namespace(tuple(key), properties=dict(properties or {})))

    @staticmethod
    def delete(key: ContentKey) -> Operation:
        return Operation("DELETE", tuple(key))

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": self.type, "key": _key_json(self.key)}
        if self.content is not None:
            data["content"] = self.content.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Operation:
        content = data.get("content")
        return cls(data["type"], _key(data["key"]), content_from_json(content) if content else None)


@dataclass(frozen=True)
class CommitResult:
    hash: str
    added_contents: dict[ContentKey, str]
    """Content ids Nessie assigned to keys that were new in this commit."""


@dataclass(frozen=True)
class LogEntry:
    hash: str
    message: str
    author: str
    properties: dict[str, str]
    commit_time: datetime
    parent_hash: str | None = None
    operations: tuple[Operation, ...] | None = None
    """Only filled when history was asked with ``fetch_all=True``."""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LogEntry:
        meta = data["commitMeta"]
        ops = data.get("operations")
        return cls(
            hash=meta["hash"],
            message=meta.get("message") or "",
            author=next(iter(meta.get("authors") or ()), "") or "",
            # Nessie allows several values per property; causeway writes one, so the last one wins.
            properties={k: v[-1] for k, v in (meta.get("allProperties") or {}).items() if v},
            commit_time=datetime.fromisoformat(meta["commitTime"]),
            parent_hash=data.get("parentCommitHash"),
            operations=tuple(Operation.from_json(o) for o in ops) if ops is not None else None,
        )


@dataclass(frozen=True)
class Entry:
    key: ContentKey
    type: str
    content_id: str | None
    content: Content | None
    """Only filled when entries were asked with ``content=True``."""


@dataclass(frozen=True)
class DiffEntry:
    key: ContentKey
    from_content: Content | None
    to_content: Content | None


@dataclass(frozen=True)
class KeyMergeResult:
    key: ContentKey
    merge_behavior: str
    conflict: Conflict | None


@dataclass(frozen=True)
class MergeResult:
    """Outcome of a merge or transplant. A dry run that would succeed has ``was_applied=False``."""

    was_applied: bool
    was_successful: bool
    resultant_target_hash: str | None
    common_ancestor: str | None
    effective_target_hash: str | None
    details: tuple[KeyMergeResult, ...]

    @property
    def conflicts(self) -> list[Conflict]:
        return [d.conflict for d in self.details if d.conflict is not None]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MergeResult:
        details = tuple(
            KeyMergeResult(
                _key(d["key"]),
                d.get("mergeBehavior") or "",
                Conflict.from_json(d["conflict"]) if d.get("conflict") else None,
            )
            for d in data.get("details") or ()
        )
        return cls(
            was_applied=bool(data.get("wasApplied")),
            was_successful=bool(data.get("wasSuccessful")),
            resultant_target_hash=data.get("resultantTargetHash"),
            common_ancestor=data.get("commonAncestor"),
            effective_target_hash=data.get("effectiveTargetHash"),
            details=details,
        )


@dataclass(frozen=True)
class Page(Generic[E]):
    """One page of a paged answer; iterate it for its items."""

    items: list[E]
    token: str | None
    has_more: bool

    def __iter__(self) -> Iterator[E]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


def _key(data: dict[str, Any]) -> ContentKey:
    return tuple(data["elements"])


def _key_json(key: ContentKey) -> dict[str, Any]:
    return {"elements": list(key)}


def _key_path(key: ContentKey) -> str:
    # Nessie's path form of a key: elements joined by '.', a '.' inside an element sent as U+001D.
    return ".".join(e.replace(".", "\u001d") for e in key)


def _ref(ref: str) -> str:
    """A reference as one path segment: '/' in branch names must travel as %2F."""
    return quote(ref, safe="@*~^:")


def _content_or_none(data: dict[str, Any] | None) -> Content | None:
    return content_from_json(data) if data else None


# --- requests: each endpoint once ----------------------------------------------------------------


@dataclass(frozen=True)
class _Call(Generic[T]):
    """One HTTP request and the parser of its 2xx JSON answer.

    ``unsafe`` marks a non-idempotent write (commit, merge, transplant): once it may have reached the
    server, a failure means its outcome is unknown and it is never sent again automatically.
    """

    method: str
    path: str
    parse: Callable[[Any], T]
    params: dict[str, Any] | None = None
    body: Any = None
    unsafe: bool = False

    def result(self, status: int, content: bytes) -> T:
        if 200 <= status < 300:
            try:
                return self.parse(orjson.loads(content) if content else None)
            except (ValueError, KeyError, TypeError) as exc:  # not Nessie's JSON: a wrong URL
                raise NessieNotAnApi(f"{self.method} {self.path} answered {type(exc).__name__}: {exc}") from exc
        raise error_from_response(status, content, outcome_unknown=self.unsafe)


def _params(**values: Any) -> dict[str, Any]:
    """Query parameters without the unset ones; Nessie spells them with dashes."""
    return {k.replace("_", "-"): v for k, v in values.items() if v is not None}


def _page(items_field: str, item: Callable[[dict[str, Any]], E]) -> Callable[[Any], Page[E]]:
    def parse(data: dict[str, Any]) -> Page[E]:
        return Page([item(x) for x in data.get(items_field) or ()], data.get("token"), bool(data.get("hasMore")))

    return parse


def _reference(data: dict[str, Any]) -> Reference:
    return Reference.from_json(data["reference"])


def _merge_body(
    from_ref_name: str,
    default_mode: MergeMode,
    dry_run: bool,
    return_conflict_as_result: bool,
    message: str | None,
    key_modes: Mapping[ContentKey, MergeMode] | None,
) -> dict[str, Any]:
    # Measured on 0.99: the flags are spelled isDryRun / isReturnConflictAsResult. A plain "dryRun"
    # is ignored without an error, and the merge is then applied for real.
    body: dict[str, Any] = {
        "fromRefName": from_ref_name,
        "defaultKeyMergeMode": default_mode,
        "isDryRun": dry_run,
        "isReturnConflictAsResult": return_conflict_as_result,
    }
    if message is not None:
        body["message"] = message
    if key_modes:
        body["keyMergeModes"] = [{"key": _key_json(k), "mergeBehavior": m} for k, m in key_modes.items()]
    return body


class _Requests:
    """The REST v2 endpoints as ``_Call`` builders. The clients expose them under the same names."""

    @staticmethod
    def config() -> _Call[Config]:
        """The server's configuration: default branch, spec version, the empty-repository hash."""
        return _Call(
            "GET",
            "/config",
            lambda d: Config(
                d["defaultBranch"],
                d.get("specVersion", ""),
                d.get("noAncestorHash", ""),
                d.get("actualApiVersion", 2),
            ),
        )

    @staticmethod
    def list_references(*, page_token: str | None = None) -> _Call[Page[Reference]]:
        """All branches and tags."""
        return _Call("GET", "/trees", _page("references", Reference.from_json), _params(page_token=page_token))

    @staticmethod
    def get_reference(name: str) -> _Call[Reference]:
        """A branch or tag by name (no ``@hash``). Raises NessieNotFound."""
        return _Call("GET", f"/trees/{_ref(name)}", _reference)

    @staticmethod
    def create_branch(name: str, source: Reference) -> _Call[Reference]:
        """Create branch ``name`` at ``source.hash``. Raises NessieReferenceAlreadyExists, NessieNotFound."""
        return _Call("POST", "/trees", _reference, {"name": name, "type": "BRANCH"}, source.to_json())

    @staticmethod
    def create_tag(name: str, source: Reference) -> _Call[Reference]:
        """Create tag ``name`` at ``source.hash``."""
        return _Call("POST", "/trees", _reference, {"name": name, "type": "TAG"}, source.to_json())

    @staticmethod
    def delete_reference(name: str, expected_hash: str, type: RefType = "BRANCH") -> _Call[Reference]:
        """Delete a branch or tag if it is still at ``expected_hash``; raises NessieConflict otherwise."""
        return _Call("DELETE", f"/trees/{_ref(name)}@{expected_hash}", _reference, {"type": type})

    @staticmethod
    def assign_reference(name: str, expected_hash: str, to: Reference, type: RefType = "BRANCH") -> _Call[Reference]:
        """Point ``name`` at ``to.hash`` if it is still at ``expected_hash``; returns the new state."""
        return _Call("PUT", f"/trees/{_ref(name)}@{expected_hash}", _reference, {"type": type}, to.to_json())

    @staticmethod
    def commit(
        branch: str,
        expected_hash: str,
        operations: Sequence[Operation | Mapping[str, Any]],
        message: str,
        author: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> _Call[CommitResult]:
        """Apply ``operations`` atomically on ``branch``.

        ``expected_hash`` may be behind the head: Nessie rebases unless a touched key changed since,
        then raises NessieConflict. Any other failure after sending raises CommitStateUnknown.
        A raw JSON operation (a mapping) is sent as it is.
        """
        meta: dict[str, Any] = {
            "message": message,
            "allProperties": {k: [v] for k, v in (properties or {}).items()},
        }
        if author:
            meta["authors"] = [author]
        body = {
            "commitMeta": meta,
            "operations": [dict(op) if isinstance(op, Mapping) else op.to_json() for op in operations],
        }

        def parse(d: dict[str, Any]) -> CommitResult:
            added = {_key(a["key"]): a["contentId"] for a in d.get("addedContents") or ()}
            return CommitResult(d["targetBranch"]["hash"], added)

        path = f"/trees/{_ref(branch)}@{expected_hash}/history/commit"
        return _Call("POST", path, parse, body=body, unsafe=True)

    @staticmethod
    def get_contents(ref: str, keys: Sequence[ContentKey]) -> _Call[dict[ContentKey, Content]]:
        """Contents of ``keys`` at ``ref``; keys that do not exist are absent from the answer."""
        if not keys:
            raise ValueError("get_contents needs at least one key")
        body = {"requestedKeys": [_key_json(k) for k in keys]}
        return _Call(
            "POST",
            f"/trees/{_ref(ref)}/contents",
            lambda d: {_key(c["key"]): content_from_json(c["content"]) for c in d.get("contents") or ()},
            body=body,
        )

    @staticmethod
    def get_contents_and_reference(
        ref: str, keys: Sequence[ContentKey]
    ) -> _Call[tuple[dict[ContentKey, Content], Reference]]:
        """``get_contents``, plus the reference the server read them at (its hash and type): a writer
        pins that hash as its expected hash, so one round trip replaces a reference read and a
        contents read (the contents are those of exactly that commit)."""
        if not keys:
            raise ValueError("get_contents_and_reference needs at least one key")

        def parse(d: dict[str, Any]) -> tuple[dict[ContentKey, Content], Reference]:
            found = {_key(c["key"]): content_from_json(c["content"]) for c in d.get("contents") or ()}
            return found, Reference.from_json(d["effectiveReference"])

        return _Call(
            "POST", f"/trees/{_ref(ref)}/contents", parse, body={"requestedKeys": [_key_json(k) for k in keys]}
        )

    @staticmethod
    def get_entries(
        ref: str,
        *,
        content: bool = False,
        prefix: ContentKey | None = None,
        filter: str | None = None,
        max_records: int | None = None,
        page_token: str | None = None,
    ) -> _Call[Page[Entry]]:
        """Keys at ``ref``, with their content when ``content``; ``prefix`` keeps one namespace's."""
        params = _params(
            content="true" if content else None,
            prefix_key=_key_path(prefix) if prefix else None,
            filter=filter,
            max_records=max_records,
            page_token=page_token,
        )
        return _Call(
            "GET",
            f"/trees/{_ref(ref)}/entries",
            _page(
                "entries",
                lambda e: Entry(
                    _key(e["name"]),
                    e["type"],
                    e.get("contentId"),
                    _content_or_none(e.get("content")),
                ),
            ),
            params,
        )

    @staticmethod
    def history(
        ref: str,
        *,
        max_records: int | None = None,
        filter: str | None = None,
        fetch_all: bool = False,
        page_token: str | None = None,
    ) -> _Call[Page[LogEntry]]:
        """Commits reachable from ``ref``, newest first, a page (at most ``max_records``) at a time.

        ``filter`` is CEL over ``commit.*``. Guard map lookups, as in ``'b' in commit.properties &&
        commit.properties['b'] == 'x'``: on 0.99 an unguarded lookup on a commit lacking the key is a 500.
        """
        params = _params(
            max_records=max_records,
            filter=filter,
            fetch="ALL" if fetch_all else None,
            page_token=page_token,
        )
        return _Call("GET", f"/trees/{_ref(ref)}/history", _page("logEntries", LogEntry.from_json), params)

    @staticmethod
    def diff(
        from_ref: str, to_ref: str, *, max_records: int | None = None, page_token: str | None = None
    ) -> _Call[Page[DiffEntry]]:
        """Keys whose content differs between two references."""
        return _Call(
            "GET",
            f"/trees/{_ref(from_ref)}/diff/{_ref(to_ref)}",
            _page(
                "diffs",
                lambda d: DiffEntry(
                    _key(d["key"]),
                    _content_or_none(d.get("from")),
                    _content_or_none(d.get("to")),
                ),
            ),
            _params(max_records=max_records, page_token=page_token),
        )

    @staticmethod
    def merge(
        target: str,
        expected_hash: str,
        from_ref_name: str,
        from_hash: str,
        *,
        default_mode: MergeMode = "NORMAL",
        dry_run: bool = False,
        return_conflict_as_result: bool = False,
        message: str | None = None,
        key_modes: Mapping[ContentKey, MergeMode] | None = None,
    ) -> _Call[MergeResult]:
        """Merge ``from_ref_name`` up to ``from_hash`` into branch ``target``.

        Conflicts raise NessieConflict, or come back in ``MergeResult.conflicts`` with
        ``return_conflict_as_result``. A real merge that fails after sending raises CommitStateUnknown.
        """
        body = _merge_body(from_ref_name, default_mode, dry_run, return_conflict_as_result, message, key_modes)
        body["fromHash"] = from_hash
        path = f"/trees/{_ref(target)}@{expected_hash}/history/merge"
        return _Call("POST", path, MergeResult.from_json, body=body, unsafe=not dry_run)

    @staticmethod
    def transplant(
        target: str,
        expected_hash: str,
        from_ref_name: str,
        hashes: Sequence[str],
        *,
        default_mode: MergeMode = "NORMAL",
        dry_run: bool = False,
        return_conflict_as_result: bool = False,
        message: str | None = None,
        key_modes: Mapping[ContentKey, MergeMode] | None = None,
    ) -> _Call[MergeResult]:
        """Replay the commits ``hashes`` (oldest first) of ``from_ref_name`` onto branch ``target``."""
        body = _merge_body(from_ref_name, default_mode, dry_run, return_conflict_as_result, message, key_modes)
        body["hashesToTransplant"] = list(hashes)
        path = f"/trees/{_ref(target)}@{expected_hash}/history/transplant"
        return _Call("POST", path, MergeResult.from_json, body=body, unsafe=not dry_run)


# --- sending: retries, then the two clients --------------------------------------------------------

# Failures that happen before a single byte of the request left: a retry cannot apply anything twice.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """Retry 429, 503 and transport errors with full-jitter exponential backoff.

    An unsafe call (commit, merge, transplant) is retried only when it surely did not land: a 429 or
    a failure to connect. A 503, 5xx or timeout after sending raises CommitStateUnknown instead.
    """

    attempts: int = 5
    base_s: float = 0.1
    cap_s: float = 5.0

    def backoff(self, attempt: int) -> float:
        return random.uniform(0, min(self.cap_s, self.base_s * 2**attempt))

    def after_response(self, call: _Call[Any], attempt: int, status: int) -> float | None:
        """Seconds to wait before resending, or None when an answer with ``status`` is final."""
        retryable = status == 429 or (status == 503 and not call.unsafe)
        if not retryable or attempt + 1 >= self.attempts:
            return None
        log.warning("nessie %s %s answered %s; retry %d", call.method, call.path, status, attempt + 1)
        return self.backoff(attempt)

    def after_error(self, call: _Call[Any], attempt: int, exc: httpx.TransportError) -> float:
        """Seconds to wait before resending; raises the mapped error when there is no retry."""
        maybe_applied = call.unsafe and not isinstance(exc, _NOT_SENT)
        if maybe_applied or attempt + 1 >= self.attempts:
            raise error_from_transport(exc, outcome_unknown=maybe_applied) from exc
        log.warning("nessie %s %s failed: %r; retry %d", call.method, call.path, exc, attempt + 1)
        return self.backoff(attempt)


class _Base:
    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        auth: NessieAuth | None = None,
        verify: Any = True,
    ) -> None:
        """``timeout`` is per request, in seconds; an empty ``token`` means no auth.

        ``auth`` and ``verify`` come from streams.security.nessie_http_options (OAuth2, CA file).
        """
        self.base_url = base_url.rstrip("/")
        self.retry = retry or RetryPolicy()
        self._timeout = timeout
        # Spec 2 makes Nessie put the conflict list into 409 answers.
        self._headers = {"Nessie-Client-Spec": "2", "Accept": "application/json"} | (
            {"Authorization": f"Bearer {token}"} if token else {}
        )
        self._auth = auth
        self._verify = verify

    @classmethod
    def from_settings(cls, settings: Settings, **kw: Any) -> Self:
        """A client for ``CAUSEWAY_NESSIE_URL`` with its token and timeout."""
        return cls(settings.nessie_url, timeout=settings.nessie_timeout_s, **nessie_http_options(settings) | kw)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({mask_url(self.base_url)!r})"


# A client method is a ``_Requests`` builder wrapped in how that client sends. ParamSpec keeps the
# builder's signature, so callers and mypy see e.g. ``NessieClient.commit(branch, ...) -> CommitResult``.


def _async(build: Callable[P, _Call[T]]) -> Callable[Concatenate[NessieClient, P], Coroutine[Any, Any, T]]:
    @functools.wraps(build)
    async def method(self: NessieClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._send(build(*args, **kwargs))

    return method


def _turn_page(page: Page[Any], kwargs: dict[str, Any]) -> bool:
    """Point ``kwargs`` at the page after ``page``; False when it was the last (the one paging rule
    of the sync and async clients, which differ only in how they send)."""
    if not (page.has_more and page.token):
        return False
    kwargs["page_token"] = page.token
    return True


def _async_pages(
    build: Callable[P, _Call[Page[E]]],
) -> Callable[Concatenate[NessieClient, P], AsyncIterator[Page[E]]]:
    @functools.wraps(build)
    async def method(self: NessieClient, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[Page[E]]:
        page_build: Callable[..., _Call[Page[E]]] = build
        more = True
        while more:
            page = await self._send(page_build(*args, **kwargs))
            yield page
            more = _turn_page(page, kwargs)

    return method


def _async_items(
    build: Callable[P, _Call[Page[E]]],
) -> Callable[Concatenate[NessieClient, P], AsyncIterator[E]]:
    pages = _async_pages(build)

    @functools.wraps(build)
    async def method(self: NessieClient, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[E]:
        # Lazily: a caller that stops early (found its batch id) fetches no further page.
        async for page in pages(self, *args, **kwargs):
            for item in page:
                yield item

    return method


def _async_all(
    build: Callable[P, _Call[Page[E]]],
) -> Callable[Concatenate[NessieClient, P], Coroutine[Any, Any, list[E]]]:
    items = _async_items(build)

    @functools.wraps(build)
    async def method(self: NessieClient, /, *args: P.args, **kwargs: P.kwargs) -> list[E]:
        return [item async for item in items(self, *args, **kwargs)]

    return method


def _sync(build: Callable[P, _Call[T]]) -> Callable[Concatenate[SyncNessieClient, P], T]:
    @functools.wraps(build)
    def method(self: SyncNessieClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._send(build(*args, **kwargs))

    return method


def _sync_pages(
    build: Callable[P, _Call[Page[E]]],
) -> Callable[Concatenate[SyncNessieClient, P], Iterator[Page[E]]]:
    @functools.wraps(build)
    def method(self: SyncNessieClient, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[Page[E]]:
        page_build: Callable[..., _Call[Page[E]]] = build
        more = True
        while more:
            page = self._send(page_build(*args, **kwargs))
            yield page
            more = _turn_page(page, kwargs)

    return method


def _sync_items(
    build: Callable[P, _Call[Page[E]]],
) -> Callable[Concatenate[SyncNessieClient, P], Iterator[E]]:
    pages = _sync_pages(build)

    @functools.wraps(build)
    def method(self: SyncNessieClient, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[E]:
        for page in pages(self, *args, **kwargs):
            yield from page

    return method


def _sync_all(build: Callable[P, _Call[Page[E]]]) -> Callable[Concatenate[SyncNessieClient, P], list[E]]:
    items = _sync_items(build)

    @functools.wraps(build)
    def method(self: SyncNessieClient, /, *args: P.args, **kwargs: P.kwargs) -> list[E]:
        return list(items(self, *args, **kwargs))

    return method


class NessieClient(_Base):
    """Async Nessie REST v2 client. Use as ``async with NessieClient.from_settings(s) as nessie:``.

    Raises the ``sinks.errors`` hierarchy: NessieConflict, NessieNotFound, NessieBadRequest,
    NessieAuthError, NessieUnavailable and its subclass CommitStateUnknown.
    """

    def __init__(self, base_url: str, **kw: Any) -> None:
        super().__init__(base_url, **kw)
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(self._timeout),
            headers=self._headers,
            auth=self._auth,
            verify=self._verify,
        )

    async def _send(self, call: _Call[T]) -> T:
        delay: float | None
        for attempt in range(self.retry.attempts):
            try:
                response = await self._http.request(call.method, call.path, params=call.params, json=call.body)
            except httpx.TransportError as exc:
                delay = self.retry.after_error(call, attempt, exc)
            else:
                delay = self.retry.after_response(call, attempt, response.status_code)
                if delay is None:
                    return call.result(response.status_code, response.content)
            await asyncio.sleep(delay)
        raise NessieError("unreachable: the retry policy allows no attempt")

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> NessieClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    config = _async(_Requests.config)
    list_references = _async_all(_Requests.list_references)
    get_reference = _async(_Requests.get_reference)
    create_branch = _async(_Requests.create_branch)
    create_tag = _async(_Requests.create_tag)
    delete_reference = _async(_Requests.delete_reference)
    assign_reference = _async(_Requests.assign_reference)
    commit = _async(_Requests.commit)
    get_contents = _async(_Requests.get_contents)
    get_contents_and_reference = _async(_Requests.get_contents_and_reference)
    get_entries = _async_all(_Requests.get_entries)
    history = _async_pages(_Requests.history)
    history_entries = _async_items(_Requests.history)
    diff = _async_all(_Requests.diff)
    merge = _async(_Requests.merge)
    transplant = _async(_Requests.transplant)


class SyncNessieClient(_Base):
    """The same client for synchronous callers (pyiceberg's Catalog); same methods, same errors.

    It sends over ``sinks.nessie_http.KeptConnections`` rather than httpx.Client: about a tenth of the
    CPU per request, with the same error classes, so ``RetryPolicy`` decides the same way.
    """

    def __init__(self, base_url: str, **kw: Any) -> None:
        super().__init__(base_url, **kw)
        headers = dict(self._headers)
        # Sent per request, so that ``auth``'s token replaces it as in httpx's auth flow.
        self._bearer = headers.pop("Authorization", None)
        self._http = KeptConnections(self.base_url, timeout=self._timeout, headers=headers, verify=self._verify)

    def _exchange(self, call: _Call[Any], body: bytes | None) -> tuple[int, bytes]:
        """One attempt: the request with the current token and, as httpx's OAuth2 flow did, once
        more with a fresh token after a 401 (a 401 applied nothing, even for a commit)."""
        auth = self._auth
        send = functools.partial(self._http.request, call.method, call.path, params=call.params, body=body)
        answer = send(authorization=(auth.authorization() if auth else None) or self._bearer)
        if answer.status_code == 401 and auth is not None and auth.oauth:
            answer = send(authorization=auth.authorization(force=True))
        return answer.status_code, answer.content

    def _send(self, call: _Call[T]) -> T:
        body = None if call.body is None else orjson.dumps(call.body)  # once, for every attempt
        delay: float | None
        for attempt in range(self.retry.attempts):
            try:
                status, content = self._exchange(call, body)
            except httpx.TransportError as exc:
                delay = self.retry.after_error(call, attempt, exc)
            else:
                delay = self.retry.after_response(call, attempt, status)
                if delay is None:
                    return call.result(status, content)
            time.sleep(delay)
        raise NessieError("unreachable: the retry policy allows no attempt")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SyncNessieClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    config = _sync(_Requests.config)
    list_references = _sync_all(_Requests.list_references)
    get_reference = _sync(_Requests.get_reference)
    create_branch = _sync(_Requests.create_branch)
    create_tag = _sync(_Requests.create_tag)
    delete_reference = _sync(_Requests.delete_reference)
    assign_reference = _sync(_Requests.assign_reference)
    commit = _sync(_Requests.commit)
    get_contents = _sync(_Requests.get_contents)
    get_contents_and_reference = _sync(_Requests.get_contents_and_reference)
    get_entries = _sync_all(_Requests.get_entries)
    history = _sync_pages(_Requests.history)
    history_entries = _sync_items(_Requests.history)
    diff = _sync_all(_Requests.diff)
    merge = _sync(_Requests.merge)
    transplant = _sync(_Requests.transplant)
