"""The s3:// warehouse option, against a local S3-compatible server (moto) and the real Nessie."""

from __future__ import annotations

import boto3
import httpx
import pytest

from models.events import ChangeEvent, ChangeType, EntityKind
from sinks.committer import Batch, BatchCommitter, Source
from sinks.readback import read_world
from streams.settings import Secret, Settings
from tests.integration import s3_fixtures

pytestmark = pytest.mark.integration
s3_endpoint = s3_fixtures.s3_endpoint


def test_tables_land_in_s3_and_read_back(s3_endpoint: str, nessie_url: str, unique: str) -> None:
    s3 = boto3.client(
        "s3", endpoint_url=s3_endpoint, aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    )
    s3.create_bucket(Bucket="causeway-test")
    settings = Settings.from_env().replace(
        warehouse=f"s3://causeway-test/wh-{unique}",
        s3_endpoint=s3_endpoint,
        s3_access_key=Secret("k"),
        s3_secret_key=Secret("s"),
        prod_world=f"p{unique}",
        main_branch=f"s3main-{unique}",
    )
    root = httpx.get(f"{nessie_url}/config").json()["noAncestorHash"]
    httpx.post(
        f"{nessie_url}/trees",
        params={"name": settings.main_branch, "type": "BRANCH"},
        json={"type": "BRANCH", "name": "main", "hash": root},
    ).raise_for_status()
    events = [
        ChangeEvent(
            event_id=f"e{i}-{unique}",
            world_id=settings.prod_world,
            kind=EntityKind.OBJECT,
            entity_type="T",
            entity_pk=f"p{i % 3}",
            change_type=ChangeType.SNAPSHOT,
            version=i + 1,
            before=None,
            after={"i": i},
            caused_by=None,
            causal_order=None,
            occurred_at_ms=0,
            schema_version=0,
            source="",
        )
        for i in range(6)
    ]
    committer = BatchCommitter(settings)
    committer.commit_batch(
        Batch.from_sources(
            settings.prod_world, f"b1-{unique}", [(e, Source("t", 0, n)) for n, e in enumerate(events[:3])]
        )
    )
    committer.commit_batch(
        Batch.from_sources(
            settings.prod_world, f"b2-{unique}", [(e, Source("t", 0, n + 3)) for n, e in enumerate(events[3:])]
        )
    )
    state = read_world(settings, settings.prod_world)
    assert state.objects == {f"p{k}": {"type": "T", "version": k + 4, "properties": {"i": k + 3}} for k in range(3)}
    assert sorted(state.event_ids) == sorted(e.event_id for e in events)
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="causeway-test")["Contents"]]
    assert any(k.endswith(".parquet") for k in keys) and any(k.endswith(".metadata.json") for k in keys)
    assert all(k.startswith(f"wh-{unique}/") for k in keys)
