from __future__ import annotations

import pytest

from models.worlds import InvalidWorldId, WorldNaming, validate_world_id


@pytest.mark.parametrize(
    "bad",
    [
        "main@abc",
        "../x",
        "",
        "a" * 300,
        "wörld",
        "World",
        "a b",
        "x~1",
        "x*2026",
        "-x",
        "a/b",
        "a\x00b",
        None,
        7,
    ],
)
def test_bad_world_ids_are_rejected_with_a_reason(bad: object) -> None:
    with pytest.raises(InvalidWorldId) as info:
        validate_world_id(bad)
    assert info.value.reason
    assert "invalid world id" in str(info.value)


@pytest.mark.parametrize("good", ["prod", "whatif-001", "a", "dev_2", "x" * 63])
def test_good_world_ids(good: str) -> None:
    assert validate_world_id(good) == good


def test_naming_maps_prod_to_main_and_back() -> None:
    naming = WorldNaming()
    assert naming.branch("prod") == "main"
    assert naming.branch("whatif-001") == "world-whatif-001"
    assert naming.world("world-whatif-001") == "whatif-001"
    assert naming.world("main") == "prod"
    assert naming.world("feature-x") is None
    with pytest.raises(InvalidWorldId):
        naming.branch("main@abc")
