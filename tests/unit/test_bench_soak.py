"""The soak's verdict: flat means the last three windows after warm-up are at most 1.3 × the first three."""

from bench.soak import _flat


def test_a_series_that_grows_by_more_than_the_bar_is_growing() -> None:
    assert _flat([9, 9, 1.0, 1.0, 1.0, 1.2, 1.4, 1.4, 1.4])["verdict"] == "growing"


def test_a_series_within_the_bar_is_flat_and_warm_up_windows_do_not_count() -> None:
    verdict = _flat([50, 40, 1.0, 1.0, 1.0, 1.1, 1.2, 1.3, 1.2])
    assert verdict["verdict"] == "flat" and verdict["ratio"] == 1.233


def test_a_lag_under_its_floor_is_flat_even_from_zero() -> None:
    assert _flat([0, 0, 0, 0, 0, 0, 10, 12, 900], floor=5000)["verdict"] == "flat"
    assert _flat([0, 0, 0, 0, 0, 0, 10, 12, 90_000], floor=5000)["verdict"] == "growing"


def test_too_few_windows_give_no_verdict() -> None:
    assert _flat([1, 1, 1, 1, 1])["verdict"] == "too short"
