"""Consumer-group offsets: lag rows and reset plans (pure; the I/O is in ``ops.offsets.run``).

A reset is refused while the group has members, like Kafka's own ``kafka-consumer-groups.sh``:
a running worker would overwrite the new offsets with its own on its next commit, and the broker
would reject a commit from outside an active generation anyway. Stop the workers first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from models.errors import OperatorError
from sinks.committed_offsets import PartitionId
from streams.lag import partition_lag

STRATEGIES = ("earliest", "latest", "timestamp", "offset")


class ResetRefused(OperatorError):
    """The reset may not run now (the group has members, or the target is unusable)."""


@dataclass(frozen=True)
class Member:
    member_id: str
    client_id: str
    host: str


@dataclass(frozen=True)
class GroupState:
    group: str
    state: str  # Empty, Stable, PreparingRebalance, Dead, ... (as the broker says)
    members: tuple[Member, ...]

    @property
    def active(self) -> bool:
        return bool(self.members)


@dataclass(frozen=True)
class LagRow:
    topic: str
    partition: int
    committed: int | None  # None: the group never committed this partition
    start: int  # log start offset
    end: int  # log end offset

    @property
    def lag(self) -> int:
        return partition_lag(self.end, self.start, self.committed)


@dataclass(frozen=True)
class ResetRow:
    topic: str
    partition: int
    current: int | None
    target: int

    @property
    def delta(self) -> int | None:
        return None if self.current is None else self.target - self.current


def check_resettable(state: GroupState) -> None:
    if state.active:
        who = ", ".join(f"{m.client_id}@{m.host}" for m in state.members[:5])
        raise ResetRefused(
            f"group {state.group} has {len(state.members)} active member(s) (state {state.state}: {who}); "
            "stop its workers first, then reset"
        )


def plan_reset(
    strategy: str,
    tps: Sequence[PartitionId],
    *,
    committed: Mapping[PartitionId, int | None],
    starts: Mapping[PartitionId, int],
    ends: Mapping[PartitionId, int],
    by_time: Mapping[PartitionId, int | None] | None = None,
    offsets: Mapping[PartitionId, int] | None = None,
) -> list[ResetRow]:
    """Target offset per partition; clamped to ``[log start, log end]`` like Kafka's tool.

    ``by_time``: ``offsets_for_times`` answers (None: no record that late, so the end).
    ``offsets``: explicit targets for ``strategy == "offset"``.
    """
    if strategy not in STRATEGIES:
        raise ResetRefused(f"unknown reset target {strategy!r}: use one of {', '.join(STRATEGIES)}")
    rows = []
    for tp in tps:
        if strategy == "earliest":
            target = starts[tp]
        elif strategy == "latest":
            target = ends[tp]
        elif strategy == "timestamp":
            found = (by_time or {}).get(tp)
            target = ends[tp] if found is None else found
        else:
            if offsets is None or tp not in offsets:
                raise ResetRefused(f"no target offset given for {tp[0]}/{tp[1]}")
            target = offsets[tp]
        target = min(max(target, starts[tp]), ends[tp])
        rows.append(ResetRow(tp[0], tp[1], committed.get(tp), target))
    return rows


def parse_offset_targets(values: Sequence[str], tps: Sequence[PartitionId]) -> dict[PartitionId, int]:
    """``["120"]`` (every partition) or ``["0:120", "orders/1:80"]`` → ``{tp: offset}``."""
    out: dict[PartitionId, int] = {}
    for value in values:
        where, sep, num = value.rpartition(":")
        if not num.isdigit():
            raise ResetRefused(f"bad offset {value!r}: use N, PARTITION:N or TOPIC/PARTITION:N")
        if not sep:
            out.update(dict.fromkeys(tps, int(num)))
            continue
        topic, slash, part = where.rpartition("/")
        if not part.isdigit():
            raise ResetRefused(f"bad partition in {value!r}")
        hits = [tp for tp in tps if tp[1] == int(part) and (not slash or tp[0] == topic)]
        if not hits:
            raise ResetRefused(f"{value!r} names no partition of the selected topics")
        out.update(dict.fromkeys(hits, int(num)))
    return out
