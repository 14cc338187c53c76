"""Shared fixtures. Integration tests use the real services started by scripts/services.sh.

A missing service is an error, never a skip: the message says how to start it. A missing tool
(promtool) is a skip outside CI and an error in CI (env CI set). Tests run in parallel processes
(scripts/test.sh; tests/parallel.py says which tests share something and run in one process).
"""

from __future__ import annotations

import socket
import uuid
from urllib.parse import urlparse

import pytest
from hypothesis import settings as hypothesis_settings

from streams.settings import Settings
from tests import parallel
from tests.tools import require_promtool

START_HINT = "start the services with: scripts/services.sh start"

# Tests check behaviour, not wall time: Hypothesis's default 200 ms deadline per example failed a
# property test of the marks' packing on a box at load 9 (examples of 20 arguments of 9 KB each).
hypothesis_settings.register_profile("causeway", deadline=None)
hypothesis_settings.load_profile("causeway")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


def require(name: str, url_or_hostport: str) -> None:
    """Fail (not skip) when a real service is absent."""
    if "://" in url_or_hostport:
        parsed = urlparse(url_or_hostport)
        host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    else:
        host, _, port_s = url_or_hostport.split(",")[0].rpartition(":")
        port = int(port_s)
    if not _reachable(host, port):
        pytest.fail(f"{name} is not reachable at {url_or_hostport}; {START_HINT}", pytrace=False)


@pytest.fixture(scope="session")
def settings() -> Settings:
    return Settings.from_env()


@pytest.fixture(scope="session")
def kafka_bootstrap(settings: Settings) -> str:
    require("Kafka", settings.kafka_bootstrap)
    return settings.kafka_bootstrap


@pytest.fixture(scope="session")
def redis_url(settings: Settings) -> str:
    require("Redis", settings.redis_url)
    return settings.redis_url


@pytest.fixture(scope="session")
def nessie_url(settings: Settings) -> str:
    require("Nessie", settings.nessie_url)
    return settings.nessie_url


@pytest.fixture(scope="session")
def prometheus_url(settings: Settings) -> str:
    require("Prometheus", settings.prometheus_url)
    return settings.prometheus_url


@pytest.fixture
def unique() -> str:
    """A short unique suffix for topic, branch and key names, so tests never collide."""
    return uuid.uuid4().hex[:10]


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool's path; missing: skipped outside CI, a failure in CI (``tests.tools.require_promtool``)."""
    return require_promtool()


@pytest.fixture
def warehouse(tmp_path) -> str:
    return f"file://{tmp_path}/warehouse"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """With ``-n N`` (the default ``--dist load``), schedule by ``tests.parallel.group_of``."""
    if config.getvalue("dist") != "load":
        return None  # another --dist asked for on the command line
    return parallel.make_scheduler(config, log)


pytest_plugins = ["pytester"]
