"""A world written by causeway, read through Nessie's own Iceberg REST endpoint by pyiceberg's REST catalog.

The reader shares no code with causeway's catalog: it only knows the REST URI, the branch and S3.
Nessie's REST catalog serves object stores only, so the world lives in an s3:// warehouse on a local
S3 server (moto), and the Nessie serving it is started by ``scripts/services.sh`` itself (its own
run dir and ports: the shared Nessie is never restarted) so the script's catalog settings are what
is proven here.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from pyiceberg.catalog.rest import RestCatalog

from sinks.committer import BatchCommitter
from sinks.nessie import Reference, SyncNessieClient
from sinks.readback import read_branch
from streams.settings import Secret, Settings
from tests.integration import s3_fixtures
from tests.integration.test_committer import batch, link, obj

pytestmark = pytest.mark.integration
s3_endpoint = s3_fixtures.s3_endpoint
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def rest_nessie(s3_endpoint: str, tmp_path: Path) -> Iterator[str]:
    """A Nessie started by scripts/services.sh with the S3 warehouse; stopped by it afterwards."""
    env = dict(os.environ)
    env.update(
        CAUSEWAY_RUN_DIR=str(tmp_path / "run"),
        CAUSEWAY_NESSIE_PORT=str(_free_port()),
        CAUSEWAY_NESSIE_MANAGEMENT_PORT=str(_free_port()),
        CAUSEWAY_NESSIE_HEAP="-Xms64m -Xmx384m",
        CAUSEWAY_NESSIE_WAREHOUSE="s3://rest-test/wh",
        CAUSEWAY_S3_ENDPOINT=s3_endpoint,
        CAUSEWAY_S3_ACCESS_KEY="k",
        CAUSEWAY_S3_SECRET_KEY="s",
        CAUSEWAY_START_TIMEOUT="300",
    )
    script = str(ROOT / "scripts" / "services.sh")
    started = subprocess.run([script, "start", "nessie"], env=env, capture_output=True, text=True, timeout=400)
    try:
        assert started.returncode == 0, started.stderr[-3000:]
        yield f"http://127.0.0.1:{env['CAUSEWAY_NESSIE_PORT']}"
    finally:
        subprocess.run([script, "stop", "nessie"], env=env, capture_output=True, timeout=120)


def test_world_reads_identically_through_nessie_iceberg_rest(s3_endpoint: str, rest_nessie: str, unique: str) -> None:
    boto3.client(
        "s3", endpoint_url=s3_endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    ).create_bucket(Bucket="rest-test")
    settings = Settings.from_env().replace(
        nessie_url=f"{rest_nessie}/api/v2",
        warehouse="s3://rest-test/wh",
        s3_endpoint=s3_endpoint,
        s3_access_key=Secret("k"),
        s3_secret_key=Secret("s"),
    )
    world = f"t{unique}"
    with SyncNessieClient(settings.nessie_url) as client:
        root = Reference("main", "BRANCH", client.config().no_ancestor_hash)
        client.create_branch(f"world-{world}", root)
        committer = BatchCommitter(settings, client)
        committer.commit_batch(
            batch(
                world,
                "b1",
                [obj(world, f"p{i}", "CREATE", 1, n=i) for i in range(5)] + [link(world, "l1", 1, "p0", "p1")],
                0,
            )
        )
        committer.commit_batch(
            batch(world, "b2", [obj(world, "p0", "UPDATE", 2, n=9), obj(world, "p4", "DELETE", 2)], 6)
        )
    expected = read_branch(settings, f"world-{world}")

    # The other engine: pyiceberg's REST catalog, on the world's branch, with plain S3 credentials.
    rest = RestCatalog(
        "nessie-rest",
        uri=f"{rest_nessie}/iceberg/world-{world}",
        **{
            "py-io-impl": "pyiceberg.io.pyarrow.PyArrowFileIO",
            "s3.endpoint": s3_endpoint,
            "s3.access-key-id": "k",
            "s3.secret-access-key": "s",
            "s3.region": "us-east-1",
            "s3.remote-signing-enabled": "false",
        },
    )
    assert ("onto",) in rest.list_namespaces()
    assert {t[-1] for t in rest.list_tables("onto")} == {"entity_events", "entity_common", "entity_edge"}
    common = rest.load_table("onto.entity_common").scan().to_arrow().to_pylist()
    live = {r["object_pk"]: r["version"] for r in common if not r["deleted"]}
    assert live == {pk: o["version"] for pk, o in expected.objects.items()} == {"p0": 2, "p1": 1, "p2": 1, "p3": 1}
    edges = rest.load_table("onto.entity_edge").scan().to_arrow().to_pylist()
    assert [(e["link_pk"], e["from_pk"], e["to_pk"]) for e in edges] == [("l1", "p0", "p1")]
    events = rest.load_table("onto.entity_events").scan().to_arrow().column("event_id").to_pylist()
    assert sorted(events) == sorted(expected.event_ids)
    assert sys.executable  # the reader ran in this interpreter, without causeway's catalog
