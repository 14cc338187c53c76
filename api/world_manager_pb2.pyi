from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MergeStrategy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NORMAL: _ClassVar[MergeStrategy]
    OURS: _ClassVar[MergeStrategy]
    THEIRS: _ClassVar[MergeStrategy]
    FIELD_LEVEL: _ClassVar[MergeStrategy]
    TIMESTAMP_WINS: _ClassVar[MergeStrategy]
    MANUAL: _ClassVar[MergeStrategy]
NORMAL: MergeStrategy
OURS: MergeStrategy
THEIRS: MergeStrategy
FIELD_LEVEL: MergeStrategy
TIMESTAMP_WINS: MergeStrategy
MANUAL: MergeStrategy

class World(_message.Message):
    __slots__ = ("world_id", "branch", "head_hash")
    WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    BRANCH_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    world_id: str
    branch: str
    head_hash: str
    def __init__(self, world_id: _Optional[str] = ..., branch: _Optional[str] = ..., head_hash: _Optional[str] = ...) -> None: ...

class WorldResponse(_message.Message):
    __slots__ = ("world", "created")
    WORLD_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    world: World
    created: bool
    def __init__(self, world: _Optional[_Union[World, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class CreateWorldRequest(_message.Message):
    __slots__ = ("world_id", "display_name", "idempotency_key")
    WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    world_id: str
    display_name: str
    idempotency_key: str
    def __init__(self, world_id: _Optional[str] = ..., display_name: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class GetWorldRequest(_message.Message):
    __slots__ = ("world_id",)
    WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    world_id: str
    def __init__(self, world_id: _Optional[str] = ...) -> None: ...

class ListWorldsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListWorldsResponse(_message.Message):
    __slots__ = ("worlds", "next_page_token")
    WORLDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    worlds: _containers.RepeatedCompositeFieldContainer[World]
    next_page_token: str
    def __init__(self, worlds: _Optional[_Iterable[_Union[World, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteWorldRequest(_message.Message):
    __slots__ = ("world_id", "expected_hash", "idempotency_key")
    WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HASH_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    world_id: str
    expected_hash: str
    idempotency_key: str
    def __init__(self, world_id: _Optional[str] = ..., expected_hash: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class DeleteWorldResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class ForkWorldRequest(_message.Message):
    __slots__ = ("source_world_id", "new_world_id", "display_name", "description", "source_release", "idempotency_key", "source_commit", "dry_run")
    SOURCE_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    DISPLAY_NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_RELEASE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_COMMIT_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    source_world_id: str
    new_world_id: str
    display_name: str
    description: str
    source_release: str
    idempotency_key: str
    source_commit: str
    dry_run: bool
    def __init__(self, source_world_id: _Optional[str] = ..., new_world_id: _Optional[str] = ..., display_name: _Optional[str] = ..., description: _Optional[str] = ..., source_release: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., source_commit: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class MergeWorldRequest(_message.Message):
    __slots__ = ("source_world_id", "target_world_id", "strategy", "message", "idempotency_key", "strategy_for", "dry_run", "strategy_name")
    class StrategyForEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SOURCE_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FOR_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_NAME_FIELD_NUMBER: _ClassVar[int]
    source_world_id: str
    target_world_id: str
    strategy: MergeStrategy
    message: str
    idempotency_key: str
    strategy_for: _containers.ScalarMap[str, str]
    dry_run: bool
    strategy_name: str
    def __init__(self, source_world_id: _Optional[str] = ..., target_world_id: _Optional[str] = ..., strategy: _Optional[_Union[MergeStrategy, str]] = ..., message: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., strategy_for: _Optional[_Mapping[str, str]] = ..., dry_run: _Optional[bool] = ..., strategy_name: _Optional[str] = ...) -> None: ...

class MergeConflict(_message.Message):
    __slots__ = ("id", "kind", "entity_type", "pk", "conflict", "resolution", "json")
    ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    PK_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_FIELD_NUMBER: _ClassVar[int]
    RESOLUTION_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    id: int
    kind: str
    entity_type: str
    pk: str
    conflict: str
    resolution: str
    json: str
    def __init__(self, id: _Optional[int] = ..., kind: _Optional[str] = ..., entity_type: _Optional[str] = ..., pk: _Optional[str] = ..., conflict: _Optional[str] = ..., resolution: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class MergeResponse(_message.Message):
    __slots__ = ("status", "commit_hash", "conflicts", "source_hash", "target_head", "base", "json")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_HASH_FIELD_NUMBER: _ClassVar[int]
    CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_HASH_FIELD_NUMBER: _ClassVar[int]
    TARGET_HEAD_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    status: str
    commit_hash: str
    conflicts: _containers.RepeatedCompositeFieldContainer[MergeConflict]
    source_hash: str
    target_head: str
    base: str
    json: str
    def __init__(self, status: _Optional[str] = ..., commit_hash: _Optional[str] = ..., conflicts: _Optional[_Iterable[_Union[MergeConflict, _Mapping]]] = ..., source_hash: _Optional[str] = ..., target_head: _Optional[str] = ..., base: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class ListConflictsRequest(_message.Message):
    __slots__ = ("target_world_id", "page_size", "page_token")
    TARGET_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    target_world_id: str
    page_size: int
    page_token: str
    def __init__(self, target_world_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListConflictsResponse(_message.Message):
    __slots__ = ("source_world_id", "target_world_id", "source_hash", "target_head", "base", "conflicts", "next_page_token", "total", "json")
    SOURCE_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_HASH_FIELD_NUMBER: _ClassVar[int]
    TARGET_HEAD_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    CONFLICTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    source_world_id: str
    target_world_id: str
    source_hash: str
    target_head: str
    base: str
    conflicts: _containers.RepeatedCompositeFieldContainer[MergeConflict]
    next_page_token: str
    total: int
    json: str
    def __init__(self, source_world_id: _Optional[str] = ..., target_world_id: _Optional[str] = ..., source_hash: _Optional[str] = ..., target_head: _Optional[str] = ..., base: _Optional[str] = ..., conflicts: _Optional[_Iterable[_Union[MergeConflict, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., total: _Optional[int] = ..., json: _Optional[str] = ...) -> None: ...

class ResolveConflictRequest(_message.Message):
    __slots__ = ("target_world_id", "conflict_id", "take", "idempotency_key")
    TARGET_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    CONFLICT_ID_FIELD_NUMBER: _ClassVar[int]
    TAKE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    target_world_id: str
    conflict_id: int
    take: str
    idempotency_key: str
    def __init__(self, target_world_id: _Optional[str] = ..., conflict_id: _Optional[int] = ..., take: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class ResolveConflictResponse(_message.Message):
    __slots__ = ("conflict",)
    CONFLICT_FIELD_NUMBER: _ClassVar[int]
    conflict: MergeConflict
    def __init__(self, conflict: _Optional[_Union[MergeConflict, _Mapping]] = ...) -> None: ...

class ContinueMergeRequest(_message.Message):
    __slots__ = ("target_world_id", "message", "idempotency_key")
    TARGET_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    target_world_id: str
    message: str
    idempotency_key: str
    def __init__(self, target_world_id: _Optional[str] = ..., message: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class AbortMergeRequest(_message.Message):
    __slots__ = ("target_world_id", "idempotency_key")
    TARGET_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    target_world_id: str
    idempotency_key: str
    def __init__(self, target_world_id: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class AbortMergeResponse(_message.Message):
    __slots__ = ("aborted",)
    ABORTED_FIELD_NUMBER: _ClassVar[int]
    aborted: bool
    def __init__(self, aborted: _Optional[bool] = ...) -> None: ...

class PublishAuditRequest(_message.Message):
    __slots__ = ("source_world_id", "target_world_id", "max_drift", "max_tables", "max_changed_entities", "idempotency_key")
    SOURCE_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_DRIFT_FIELD_NUMBER: _ClassVar[int]
    MAX_TABLES_FIELD_NUMBER: _ClassVar[int]
    MAX_CHANGED_ENTITIES_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    source_world_id: str
    target_world_id: str
    max_drift: int
    max_tables: int
    max_changed_entities: int
    idempotency_key: str
    def __init__(self, source_world_id: _Optional[str] = ..., target_world_id: _Optional[str] = ..., max_drift: _Optional[int] = ..., max_tables: _Optional[int] = ..., max_changed_entities: _Optional[int] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class PublishAuditResponse(_message.Message):
    __slots__ = ("plan_id", "verdict", "blocked_by", "fast_forward", "source_hash", "target_hash", "base", "json")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_BY_FIELD_NUMBER: _ClassVar[int]
    FAST_FORWARD_FIELD_NUMBER: _ClassVar[int]
    SOURCE_HASH_FIELD_NUMBER: _ClassVar[int]
    TARGET_HASH_FIELD_NUMBER: _ClassVar[int]
    BASE_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    verdict: str
    blocked_by: _containers.RepeatedScalarFieldContainer[str]
    fast_forward: bool
    source_hash: str
    target_hash: str
    base: str
    json: str
    def __init__(self, plan_id: _Optional[str] = ..., verdict: _Optional[str] = ..., blocked_by: _Optional[_Iterable[str]] = ..., fast_forward: _Optional[bool] = ..., source_hash: _Optional[str] = ..., target_hash: _Optional[str] = ..., base: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class PublishApproveRequest(_message.Message):
    __slots__ = ("plan_id", "target_world_id", "decline", "idempotency_key")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    DECLINE_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    target_world_id: str
    decline: bool
    idempotency_key: str
    def __init__(self, plan_id: _Optional[str] = ..., target_world_id: _Optional[str] = ..., decline: _Optional[bool] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class PublishApproveResponse(_message.Message):
    __slots__ = ("plan_id", "by", "declined")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    DECLINED_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    by: str
    declined: bool
    def __init__(self, plan_id: _Optional[str] = ..., by: _Optional[str] = ..., declined: _Optional[bool] = ...) -> None: ...

class PublishRunRequest(_message.Message):
    __slots__ = ("plan_id", "target_world_id", "strategy", "keep_source", "dry_run", "idempotency_key")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    STRATEGY_FIELD_NUMBER: _ClassVar[int]
    KEEP_SOURCE_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    target_world_id: str
    strategy: str
    keep_source: bool
    dry_run: bool
    idempotency_key: str
    def __init__(self, plan_id: _Optional[str] = ..., target_world_id: _Optional[str] = ..., strategy: _Optional[str] = ..., keep_source: _Optional[bool] = ..., dry_run: _Optional[bool] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class PublishRunResponse(_message.Message):
    __slots__ = ("plan_id", "action", "outcome", "reason", "commit_hash", "path", "verified", "source_deleted", "json")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    COMMIT_HASH_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DELETED_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    action: str
    outcome: str
    reason: str
    commit_hash: str
    path: str
    verified: bool
    source_deleted: bool
    json: str
    def __init__(self, plan_id: _Optional[str] = ..., action: _Optional[str] = ..., outcome: _Optional[str] = ..., reason: _Optional[str] = ..., commit_hash: _Optional[str] = ..., path: _Optional[str] = ..., verified: _Optional[bool] = ..., source_deleted: _Optional[bool] = ..., json: _Optional[str] = ...) -> None: ...

class PublishStatusRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class PublishBranchState(_message.Message):
    __slots__ = ("source", "target", "plan_id", "verdict", "blocked_by", "drift", "first_seen", "last_audit", "last_changed", "outcome")
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    BLOCKED_BY_FIELD_NUMBER: _ClassVar[int]
    DRIFT_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEEN_FIELD_NUMBER: _ClassVar[int]
    LAST_AUDIT_FIELD_NUMBER: _ClassVar[int]
    LAST_CHANGED_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    source: str
    target: str
    plan_id: str
    verdict: str
    blocked_by: _containers.RepeatedScalarFieldContainer[str]
    drift: int
    first_seen: str
    last_audit: str
    last_changed: str
    outcome: str
    def __init__(self, source: _Optional[str] = ..., target: _Optional[str] = ..., plan_id: _Optional[str] = ..., verdict: _Optional[str] = ..., blocked_by: _Optional[_Iterable[str]] = ..., drift: _Optional[int] = ..., first_seen: _Optional[str] = ..., last_audit: _Optional[str] = ..., last_changed: _Optional[str] = ..., outcome: _Optional[str] = ...) -> None: ...

class PublishStatusResponse(_message.Message):
    __slots__ = ("states", "next_page_token")
    STATES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedCompositeFieldContainer[PublishBranchState]
    next_page_token: str
    def __init__(self, states: _Optional[_Iterable[_Union[PublishBranchState, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ListPublishLogRequest(_message.Message):
    __slots__ = ("plan_id", "page_size", "page_token")
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    plan_id: str
    page_size: int
    page_token: str
    def __init__(self, plan_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListPublishLogResponse(_message.Message):
    __slots__ = ("entries_json", "next_page_token")
    ENTRIES_JSON_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries_json: _containers.RepeatedScalarFieldContainer[str]
    next_page_token: str
    def __init__(self, entries_json: _Optional[_Iterable[str]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class Release(_message.Message):
    __slots__ = ("world_id", "name", "tag", "hash", "released_hash", "message", "created_at")
    WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    RELEASED_HASH_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    world_id: str
    name: str
    tag: str
    hash: str
    released_hash: str
    message: str
    created_at: str
    def __init__(self, world_id: _Optional[str] = ..., name: _Optional[str] = ..., tag: _Optional[str] = ..., hash: _Optional[str] = ..., released_hash: _Optional[str] = ..., message: _Optional[str] = ..., created_at: _Optional[str] = ...) -> None: ...

class CreateReleaseRequest(_message.Message):
    __slots__ = ("world_id", "release_name", "description", "idempotency_key")
    WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    world_id: str
    release_name: str
    description: str
    idempotency_key: str
    def __init__(self, world_id: _Optional[str] = ..., release_name: _Optional[str] = ..., description: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("release", "created")
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    release: Release
    created: bool
    def __init__(self, release: _Optional[_Union[Release, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class ListReleasesRequest(_message.Message):
    __slots__ = ("world_id", "page_size", "page_token")
    WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    world_id: str
    page_size: int
    page_token: str
    def __init__(self, world_id: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListReleasesResponse(_message.Message):
    __slots__ = ("releases", "next_page_token")
    RELEASES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    releases: _containers.RepeatedCompositeFieldContainer[Release]
    next_page_token: str
    def __init__(self, releases: _Optional[_Iterable[_Union[Release, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteReleaseRequest(_message.Message):
    __slots__ = ("world_id", "release_name", "idempotency_key")
    WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    RELEASE_NAME_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    world_id: str
    release_name: str
    idempotency_key: str
    def __init__(self, world_id: _Optional[str] = ..., release_name: _Optional[str] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class DeleteReleaseResponse(_message.Message):
    __slots__ = ("release", "deleted")
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    DELETED_FIELD_NUMBER: _ClassVar[int]
    release: Release
    deleted: bool
    def __init__(self, release: _Optional[_Union[Release, _Mapping]] = ..., deleted: _Optional[bool] = ...) -> None: ...

class CommitHistoryRequest(_message.Message):
    __slots__ = ("world_id", "since", "until", "author", "limit", "page_size", "page_token", "changes", "no_counts")
    WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    NO_COUNTS_FIELD_NUMBER: _ClassVar[int]
    world_id: str
    since: str
    until: str
    author: str
    limit: int
    page_size: int
    page_token: str
    changes: bool
    no_counts: bool
    def __init__(self, world_id: _Optional[str] = ..., since: _Optional[str] = ..., until: _Optional[str] = ..., author: _Optional[str] = ..., limit: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., changes: _Optional[bool] = ..., no_counts: _Optional[bool] = ...) -> None: ...

class Commit(_message.Message):
    __slots__ = ("hash", "time", "author", "message", "kind", "event_count", "json")
    HASH_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EVENT_COUNT_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    hash: str
    time: str
    author: str
    message: str
    kind: str
    event_count: int
    json: str
    def __init__(self, hash: _Optional[str] = ..., time: _Optional[str] = ..., author: _Optional[str] = ..., message: _Optional[str] = ..., kind: _Optional[str] = ..., event_count: _Optional[int] = ..., json: _Optional[str] = ...) -> None: ...

class CommitHistoryResponse(_message.Message):
    __slots__ = ("commits", "next_page_token")
    COMMITS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    commits: _containers.RepeatedCompositeFieldContainer[Commit]
    next_page_token: str
    def __init__(self, commits: _Optional[_Iterable[_Union[Commit, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DiffRequest(_message.Message):
    __slots__ = ("from_ref", "to_ref", "page_size", "page_token")
    FROM_REF_FIELD_NUMBER: _ClassVar[int]
    TO_REF_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    from_ref: str
    to_ref: str
    page_size: int
    page_token: str
    def __init__(self, from_ref: _Optional[str] = ..., to_ref: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class EntityChange(_message.Message):
    __slots__ = ("kind", "entity_type", "pk", "change", "json")
    KIND_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    PK_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    kind: str
    entity_type: str
    pk: str
    change: str
    json: str
    def __init__(self, kind: _Optional[str] = ..., entity_type: _Optional[str] = ..., pk: _Optional[str] = ..., change: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class DiffResponse(_message.Message):
    __slots__ = ("from_hash", "to_hash", "changes", "next_page_token", "json")
    FROM_HASH_FIELD_NUMBER: _ClassVar[int]
    TO_HASH_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    from_hash: str
    to_hash: str
    changes: _containers.RepeatedCompositeFieldContainer[EntityChange]
    next_page_token: str
    json: str
    def __init__(self, from_hash: _Optional[str] = ..., to_hash: _Optional[str] = ..., changes: _Optional[_Iterable[_Union[EntityChange, _Mapping]]] = ..., next_page_token: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class EntityAuditRequest(_message.Message):
    __slots__ = ("ref", "entity_type", "pk", "kind", "since", "until", "page_size", "page_token")
    REF_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    PK_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    UNTIL_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ref: str
    entity_type: str
    pk: str
    kind: str
    since: str
    until: str
    page_size: int
    page_token: str
    def __init__(self, ref: _Optional[str] = ..., entity_type: _Optional[str] = ..., pk: _Optional[str] = ..., kind: _Optional[str] = ..., since: _Optional[str] = ..., until: _Optional[str] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class AuditEntry(_message.Message):
    __slots__ = ("event_id", "change_type", "version", "commit_hash", "json")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    CHANGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_HASH_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    change_type: str
    version: int
    commit_hash: str
    json: str
    def __init__(self, event_id: _Optional[str] = ..., change_type: _Optional[str] = ..., version: _Optional[int] = ..., commit_hash: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class EntityAuditResponse(_message.Message):
    __slots__ = ("hash", "entries", "next_page_token")
    HASH_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    hash: str
    entries: _containers.RepeatedCompositeFieldContainer[AuditEntry]
    next_page_token: str
    def __init__(self, hash: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[AuditEntry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class QueryAtRequest(_message.Message):
    __slots__ = ("ref", "entity_type", "pk", "include_deleted", "page_size", "page_token")
    REF_FIELD_NUMBER: _ClassVar[int]
    ENTITY_TYPE_FIELD_NUMBER: _ClassVar[int]
    PK_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_DELETED_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    ref: str
    entity_type: str
    pk: str
    include_deleted: bool
    page_size: int
    page_token: str
    def __init__(self, ref: _Optional[str] = ..., entity_type: _Optional[str] = ..., pk: _Optional[str] = ..., include_deleted: _Optional[bool] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class QueryAtResponse(_message.Message):
    __slots__ = ("hash", "objects_json", "links_json", "next_page_token", "resolved_name", "commit_time")
    HASH_FIELD_NUMBER: _ClassVar[int]
    OBJECTS_JSON_FIELD_NUMBER: _ClassVar[int]
    LINKS_JSON_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESOLVED_NAME_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIME_FIELD_NUMBER: _ClassVar[int]
    hash: str
    objects_json: _containers.RepeatedScalarFieldContainer[str]
    links_json: _containers.RepeatedScalarFieldContainer[str]
    next_page_token: str
    resolved_name: str
    commit_time: str
    def __init__(self, hash: _Optional[str] = ..., objects_json: _Optional[_Iterable[str]] = ..., links_json: _Optional[_Iterable[str]] = ..., next_page_token: _Optional[str] = ..., resolved_name: _Optional[str] = ..., commit_time: _Optional[str] = ...) -> None: ...

class RollbackRequest(_message.Message):
    __slots__ = ("world_id", "to_ref", "force", "expected_hash", "idempotency_key", "dry_run")
    WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    TO_REF_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_HASH_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    world_id: str
    to_ref: str
    force: bool
    expected_hash: str
    idempotency_key: str
    dry_run: bool
    def __init__(self, world_id: _Optional[str] = ..., to_ref: _Optional[str] = ..., force: _Optional[bool] = ..., expected_hash: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class RollbackResponse(_message.Message):
    __slots__ = ("commit_hash", "noop", "rolled_back_commits", "target_hash", "json", "attempts")
    COMMIT_HASH_FIELD_NUMBER: _ClassVar[int]
    NOOP_FIELD_NUMBER: _ClassVar[int]
    ROLLED_BACK_COMMITS_FIELD_NUMBER: _ClassVar[int]
    TARGET_HASH_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    commit_hash: str
    noop: bool
    rolled_back_commits: int
    target_hash: str
    json: str
    attempts: int
    def __init__(self, commit_hash: _Optional[str] = ..., noop: _Optional[bool] = ..., rolled_back_commits: _Optional[int] = ..., target_hash: _Optional[str] = ..., json: _Optional[str] = ..., attempts: _Optional[int] = ...) -> None: ...

class ApplyChangesRequest(_message.Message):
    __slots__ = ("world_id", "events_json", "deadline_ms", "idempotency_key")
    WORLD_ID_FIELD_NUMBER: _ClassVar[int]
    EVENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    world_id: str
    events_json: _containers.RepeatedScalarFieldContainer[str]
    deadline_ms: int
    idempotency_key: str
    def __init__(self, world_id: _Optional[str] = ..., events_json: _Optional[_Iterable[str]] = ..., deadline_ms: _Optional[int] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class ApplyChangesResponse(_message.Message):
    __slots__ = ("status", "commit_hash", "failed_step", "message", "compensated")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_HASH_FIELD_NUMBER: _ClassVar[int]
    FAILED_STEP_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    COMPENSATED_FIELD_NUMBER: _ClassVar[int]
    status: str
    commit_hash: str
    failed_step: str
    message: str
    compensated: int
    def __init__(self, status: _Optional[str] = ..., commit_hash: _Optional[str] = ..., failed_step: _Optional[str] = ..., message: _Optional[str] = ..., compensated: _Optional[int] = ...) -> None: ...
