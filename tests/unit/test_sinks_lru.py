from sinks.lru import Lru


def test_keeping_past_the_bound_drops_the_least_recently_used_entry() -> None:
    kept: Lru[str, int] = Lru(3)
    for i, key in enumerate("abc"):
        kept.keep(key, i)
    assert kept.recent("a") == 0  # now the most recent: "b" is the oldest
    kept.keep("d", 3)
    assert list(kept) == ["c", "a", "d"]


def test_keeping_a_kept_key_again_replaces_it_and_makes_it_the_most_recent() -> None:
    kept: Lru[str, int] = Lru(2)
    kept.keep("a", 1)
    kept.keep("b", 2)
    kept.keep("a", 10)
    kept.keep("c", 3)
    assert dict(kept) == {"a": 10, "c": 3}


def test_an_absent_key_is_none_and_changes_nothing() -> None:
    kept: Lru[str, int] = Lru(2)
    kept.keep("a", 1)
    assert kept.recent("z") is None
    assert list(kept) == ["a"]
