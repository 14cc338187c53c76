"""The commit loop's retry policy, driven by fakes (no Nessie): conflicts, unknown outcomes, give-up."""

from __future__ import annotations

from datetime import datetime

import pytest

from models.errors import CausewayError, CommitError
from sinks.errors import BranchMissing, CommitStateUnknown, NessieConflict, NessieNotFound, RetriesExhausted
from sinks.nessie import CommitResult, LogEntry, Operation, Reference
from sinks.occ import PROP_WRITE_ID, Prepared, RetryPolicy, commit_loop, commit_operations


class FakeSession:
    """A catalog that pins successive heads h1, h2, ... and records discards."""

    def __init__(self, log: list[str], heads: list[str]) -> None:
        self.log, self.heads = log, heads

    def begin(self) -> str:
        head = self.heads.pop(0)
        self.log.append(f"begin {head}")
        return head

    def discard(self) -> None:
        self.log.append("discard")


class Script:
    """Attempts that fail as scripted (an exception) or succeed (a string result)."""

    def __init__(self, *steps: Exception | str) -> None:
        self.steps = list(steps)
        self.log: list[str] = []
        self.heads = [f"h{i}" for i in range(1, 50)]
        self.sleeps: list[float] = []
        self.retries: list[str] = []

    def open(self) -> FakeSession:
        return FakeSession(self.log, self.heads)

    def attempt(self, session: FakeSession, base: str, n: int) -> str:
        self.log.append(f"attempt {n} on {base}")
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step

    def run(self, retries: int = 3, **kw: object) -> str:
        return commit_loop(
            self.open,
            self.attempt,
            policy=RetryPolicy(retries, 0.1, cap_s=0.25),
            what="batch b1",
            on_retry=self.retries.append,
            sleep=self.sleeps.append,
            uniform=lambda lo, hi: hi,  # the top of the jitter range: the cap is visible
            **kw,  # type: ignore[arg-type]
        )


def test_a_conflict_backs_off_and_retries_on_a_fresh_head() -> None:
    s = Script(NessieConflict("moved"), NessieConflict("moved"), "ok")
    assert s.run() == "ok"
    assert s.log == [
        "begin h1", "attempt 1 on h1", "discard",
        "begin h2", "attempt 2 on h2", "discard",
        "begin h3", "attempt 3 on h3", "discard",
    ]  # fmt: skip
    assert s.retries == ["conflict", "conflict"]
    assert s.sleeps == [0.1, 0.2]  # exponential


def test_backoff_is_full_jitter_and_capped() -> None:
    policy = RetryPolicy(8, 0.1, cap_s=0.25)
    assert [policy.delay(n, lambda lo, hi: hi) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.25, 0.25]
    assert policy.delay(3, lambda lo, hi: lo) == 0.0
    for n in range(1, 10):
        assert 0.0 <= policy.delay(n) <= 0.25


def test_giving_up_raises_the_one_exhausted_error_after_retries_plus_one_attempts() -> None:
    s = Script(*[NessieConflict(f"moved {i}") for i in range(4)])
    with pytest.raises(RetriesExhausted, match="gave up after 4 attempts: moved 3") as info:
        s.run(retries=3)
    assert s.log.count("discard") == 4
    assert len(s.sleeps) == 3  # no pause after the last attempt
    # One type for every writer, in the project's hierarchy and still a conflict for old callers.
    assert isinstance(info.value, CommitError) and isinstance(info.value, CausewayError)
    assert isinstance(info.value, NessieConflict)
    assert isinstance(info.value.__cause__, NessieConflict)


def test_an_unknown_outcome_that_landed_is_found_and_not_committed_again() -> None:
    s = Script(CommitStateUnknown("timeout after sending"), "committed again!")
    looked: list[str | None] = []

    def lookup(since: str | None) -> str | None:
        looked.append(since)
        return "c1"

    out = s.run(lookup=lookup, landed=lambda found, attempts: f"landed {found} after {attempts}")
    assert out == "landed c1 after 1"
    assert looked == ["h1"]  # searched back to the first attempt's base
    assert s.retries == ["unknown_state"]
    assert s.steps == ["committed again!"]  # the second attempt never ran


def test_an_unknown_outcome_is_looked_up_before_every_retry_and_once_more_at_the_end() -> None:
    s = Script(CommitStateUnknown("lost"), NessieConflict("moved"), NessieConflict("moved"))
    looked: list[str | None] = []

    def lookup(since: str | None) -> str | None:
        looked.append(since)
        return "late" if len(looked) == 3 else None

    out = s.run(retries=2, lookup=lookup, landed=lambda found, attempts: f"{found}/{attempts}")
    assert out == "late/3"  # found by the final check, after the last attempt
    assert looked == ["h1", "h1", "h1"]


def test_without_a_lookup_an_unknown_outcome_is_planned_again() -> None:
    s = Script(CommitStateUnknown("lost"), "nothing to do")
    assert s.run() == "nothing to do"
    assert s.retries == ["unknown_state"]


def test_a_missing_branch_is_typed_and_not_retried() -> None:
    class Gone(FakeSession):
        def begin(self) -> str:
            raise NessieNotFound("Nessie 404 REFERENCE_NOT_FOUND: world-x", status=404)

    s = Script("never")
    with pytest.raises(BranchMissing, match="batch b1: Nessie 404") as info:
        commit_loop(lambda: Gone([], []), s.attempt, policy=RetryPolicy(3), what="batch b1", sleep=s.sleeps.append)
    assert isinstance(info.value, NessieNotFound) and info.value.status == 404
    assert s.sleeps == []


def test_other_errors_pass_through_after_discarding_the_session() -> None:
    s = Script(ValueError("bad batch"))
    with pytest.raises(ValueError, match="bad batch"):
        s.run()
    assert s.log == ["begin h1", "attempt 1 on h1", "discard"]
    assert s.sleeps == []


def test_lookup_and_landed_go_together() -> None:
    with pytest.raises(ValueError, match="go together"):
        Script("ok").run(lookup=lambda since: None)


class FakeBranch:
    """The Nessie calls of an operations commit: a head that a rival moves once, history, commits."""

    def __init__(self, rival_commits: int) -> None:
        self.heads = ["h0"]
        self.props: dict[str, dict[str, str]] = {}
        self.rival = rival_commits

    def get_reference(self, name: str) -> Reference:
        return Reference(name, "BRANCH", self.heads[-1])

    def commit(self, branch: str, expected: str, ops: list[Operation], **kw: object) -> CommitResult:
        if self.rival:  # a writer lands first: this attempt's op cannot be rebased
            self.rival -= 1
            self.heads.append(f"r{len(self.heads)}")
            raise NessieConflict(f"moved from {expected}")
        assert expected == self.heads[-1]
        self.heads.append(f"c{len(self.heads)}")
        self.props[self.heads[-1]] = dict(kw["properties"])  # type: ignore[call-overload]
        return CommitResult(self.heads[-1], {})

    def history(self, ref: str, max_records: int = 200) -> list[list[LogEntry]]:
        return [[LogEntry(h, "", "", self.props.get(h, {}), datetime(2026, 1, 1)) for h in reversed(self.heads)]]


def test_an_operations_commit_decides_again_on_the_new_head_and_lands_once() -> None:
    branch, bases, sleeps = FakeBranch(rival_commits=1), [], []

    def prepare(base: str, n: int) -> Prepared:
        bases.append(base)
        return Prepared([Operation("UNCHANGED", ("k",))], "marker", {"x": base})

    done = commit_operations(
        branch,
        "b",
        prepare,
        policy=RetryPolicy(3),
        what="marker",
        author="t",
        commit_id="w1",
        sleep=sleeps.append,  # type: ignore[arg-type]
    )
    assert bases == ["h0", "r1"] and len(sleeps) == 1
    assert done.hash == "c2" and done.attempts == 2
    assert branch.props == {"c2": {"x": "r1", PROP_WRITE_ID: "w1"}}  # one commit, carrying its id
