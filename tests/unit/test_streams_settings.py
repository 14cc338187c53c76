from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.errors import Exit
from cli.main import cli
from streams.settings import MEMORY_POOLS, Secret, Settings, SettingsError

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_and_env_overrides() -> None:
    s = Settings.from_env({"CAUSEWAY_BATCH_MAX_EVENTS": "5_000", "CAUSEWAY_NESSIE_TOKEN": "t0ps3cret"})
    assert s.batch_max_events == 5000
    assert s.nessie_token.reveal() == "t0ps3cret"
    assert "t0ps3cret" not in repr(s)
    assert Settings.from_env({}).namespace == "onto"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CAUSEWAY_BATCH_MAX_EVENTS": "lots"}, "CAUSEWAY_BATCH_MAX_EVENTS"),
        ({"CAUSEWAY_UNKNOWN_WORLD_POLICY": "ignore"}, "'dlq' or 'create'"),
        ({"CAUSEWAY_WAREHOUSE": "ftp://x"}, "CAUSEWAY_WAREHOUSE"),
        ({"CAUSEWAY_COMMIT_RETRIES": "0"}, "at least 1"),
        ({"CAUSEWAY_BATCH_IDLE_MIN_SECONDS": "-0.5"}, "CAUSEWAY_BATCH_IDLE_MIN_SECONDS=-0.5: use 0 or more"),
        ({"CAUSEWAY_BATCH_IDLE_MIN_SECONDS": "nan"}, "CAUSEWAY_BATCH_IDLE_MIN_SECONDS=nan"),
        ({"CAUSEWAY_INDEX_CACHE_IDLE_S": "-1"}, "CAUSEWAY_INDEX_CACHE_IDLE_S=-1.0: use 0 or more seconds"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        Settings.from_env(env)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"CAUSEWAY_MEMORY_POOL": "tcmalloc"}, "CAUSEWAY_MEMORY_POOL='tcmalloc': use one of default, system, jemalloc"),
        ({"CAUSEWAY_MEMORY_POOL": "System"}, "CAUSEWAY_MEMORY_POOL='System'"),
        ({"CAUSEWAY_MALLOC_ARENA_MAX": "-1"}, "CAUSEWAY_MALLOC_ARENA_MAX=-1: use 0"),
        ({"CAUSEWAY_MALLOC_ARENA_MAX": str(2**40)}, "CAUSEWAY_MALLOC_ARENA_MAX=1099511627776"),
        ({"CAUSEWAY_MALLOC_ARENA_MAX": "two"}, "CAUSEWAY_MALLOC_ARENA_MAX='two' is not a valid int"),
        ({"CAUSEWAY_MEMORY_RELEASE_INTERVAL_S": "-5"}, "CAUSEWAY_MEMORY_RELEASE_INTERVAL_S=-5.0: use 0"),
        ({"CAUSEWAY_MEMORY_RELEASE_INTERVAL_S": "inf"}, "CAUSEWAY_MEMORY_RELEASE_INTERVAL_S=inf"),
        ({"CAUSEWAY_MEMORY_RELEASE_INTERVAL_S": "nan"}, "CAUSEWAY_MEMORY_RELEASE_INTERVAL_S=nan"),
        ({"CAUSEWAY_MEMORY_RELEASE_INTERVAL_S": "1e300"}, "CAUSEWAY_MEMORY_RELEASE_INTERVAL_S=1e"),
    ],
)
def test_the_allocator_settings_fail_with_the_others_not_at_worker_start(env: dict[str, str], message: str) -> None:
    """The memory knobs were checked only when a worker applied them (streams/memory.py): a bad pool
    failed the worker's start, not `causeway config`; a negative interval silently meant never, an
    arena cap past a C int reached glibc truncated, and inf killed the releaser's thread."""
    with pytest.raises(SettingsError, match=re.escape(message)):
        Settings.from_env(env)
    r = CliRunner().invoke(cli, ["config"], env=env)
    assert r.exit_code == Exit.USAGE and message in r.output, r.output


def test_the_allocator_settings_take_their_whole_range() -> None:
    for pool in MEMORY_POOLS:
        assert Settings.from_env({"CAUSEWAY_MEMORY_POOL": pool}).memory_pool == pool
    edges = {"CAUSEWAY_MALLOC_ARENA_MAX": "0", "CAUSEWAY_MEMORY_RELEASE_INTERVAL_S": "0"}
    assert Settings.from_env(edges).memory_release_interval_s == 0.0
    assert Settings.from_env({"CAUSEWAY_MALLOC_ARENA_MAX": str(2**31 - 1)}).malloc_arena_max == 2**31 - 1


def test_secret_repr_hides_value() -> None:
    assert repr(Secret("abc")) == "Secret('***')"


def test_readme_configuration_table_is_current() -> None:
    spec = importlib.util.spec_from_file_location("urc", ROOT / "scripts/update_readme_config.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = (ROOT / "README.md").read_text()
    assert mod.render(text) == text, "README config table is stale: run scripts/update_readme_config.py"


def test_the_worker_keeps_its_local_state_under_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19.12: Faust's `<app_id>-data` folder landed in whatever directory the worker started from."""
    from streams.app import create_app

    monkeypatch.chdir(tmp_path)
    app = create_app(Settings.from_env({}, app_id="cw-datadir"))
    app._create_directories()  # what a Faust worker does on start
    assert not (tmp_path / "cw-datadir-data").exists()
    assert (tmp_path / ".causeway/run/data/cw-datadir-data").is_dir()
    elsewhere = tmp_path / "state"
    app = create_app(Settings.from_env({"CAUSEWAY_DATA_DIR": str(elsewhere)}, app_id="cw-datadir"))
    app._create_directories()
    assert (elsewhere / "cw-datadir-data").is_dir()
