"""World management against the real Nessie server, through the manager and the CLI."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cli.main import cli
from models.worlds import WorldNaming
from sinks.nessie import NessieClient, Operation
from streams.settings import Settings
from worlds.manager import ForkSource, WorldError, WorldManager

pytestmark = pytest.mark.integration


@pytest.fixture
async def manager(nessie_url: str):
    async with NessieClient(nessie_url) as nessie:
        yield WorldManager(nessie, WorldNaming())


async def _commit_namespace(nessie: NessieClient, branch: str, expected: str, name: str) -> str:
    result = await nessie.commit(
        branch,
        expected,
        [Operation.put_namespace((name,))],
        message=f"add {name}",
        author="tests",
        properties={},
    )
    return result.hash


async def test_create_is_idempotent_and_fork_sources(manager: WorldManager, unique: str) -> None:
    a, b, c, d = (f"t{unique}-{s}" for s in "abcd")
    try:
        world_a, created = await manager.create(a)
        assert created and world_a.branch == f"world-{a}"
        again, created_again = await manager.create(a)
        assert not created_again and again.hash == world_a.hash

        # Write on a, then fork b from a's head, c from a's first commit, d from a tag.
        head = await _commit_namespace(manager.nessie, world_a.branch, world_a.hash, f"ns_{unique}")
        world_b, _ = await manager.create(b, ForkSource(world=a))
        assert world_b.hash == head
        world_c, _ = await manager.create(c, ForkSource(commit=world_a.hash))
        assert world_c.hash == world_a.hash
        tag_ref = await manager.nessie.create_tag(f"tag-{unique}", await manager.nessie.get_reference(world_a.branch))
        world_d, _ = await manager.create(d, ForkSource(tag=tag_ref.name))
        assert world_d.hash == head

        listed = {w.world_id for w in await manager.list()}
        assert {a, b, c, d} <= listed and "prod" in listed

        # main did not move while worlds were written.
        main = await manager.nessie.get_reference("main")
        assert main.hash != head
    finally:
        for w in (a, b, c, d):
            await manager.delete(w)
        try:
            tag = await manager.nessie.get_reference(f"tag-{unique}")
            await manager.nessie.delete_reference(tag.name, tag.hash, "TAG")
        except Exception:  # noqa: BLE001 - cleanup only
            pass
    assert await manager.get(a) is None


async def test_delete_refuses_prod_and_missing_source(manager: WorldManager, unique: str) -> None:
    with pytest.raises(WorldError, match="production world"):
        await manager.delete("prod")
    with pytest.raises(WorldError, match="does not exist"):
        await manager.create(f"t{unique}", ForkSource(tag=f"no-such-tag-{unique}"))
    assert await manager.delete(f"never-{unique}") is False


@pytest.mark.parametrize("bad", ["main@abc", "../x", "", "a" * 300, "wörld"])
def test_cli_rejects_bad_world_ids(bad: str, nessie_url: str) -> None:
    result = CliRunner().invoke(cli, ["worlds", "create", bad], obj=Settings.from_env())
    assert result.exit_code != 0
    assert "invalid world id" in result.output
