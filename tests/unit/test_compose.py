"""docker-compose.yml cannot run here (no Docker engine); check what can be checked without it."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_has_every_service_the_stack_needs() -> None:
    services = _compose()["services"]
    for name in ("kafka", "redis", "nessie", "minio", "minio-init", "prometheus", "grafana", "worker", "lag-exporter"):
        assert name in services, f"docker-compose.yml lacks the {name} service"
    kafka_env = services["kafka"]["environment"]
    assert "controller" in kafka_env["KAFKA_PROCESS_ROLES"], "Kafka must run in KRaft mode"
    assert "mc mb" in " ".join(services["minio-init"]["command"]), "the bucket-init step must create a bucket"


def test_every_bind_mount_exists() -> None:
    mounts = []
    for name, service in _compose()["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                mounts.append((name, source))
    assert mounts, "expected bind mounts for Prometheus and Grafana"
    for name, source in mounts:
        assert (ROOT / source).exists(), f"{name} mounts {source}, which does not exist"


def test_prometheus_config_loads_our_rules() -> None:
    config = yaml.safe_load((ROOT / "monitoring/prometheus/prometheus.yml").read_text())
    assert any("rules" in path for path in config["rule_files"])
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    names = [n for sd in jobs["causeway"]["dns_sd_configs"] for n in sd["names"]]
    assert names == ["worker"], "Prometheus must discover every worker replica"
    lag = [t for sc in jobs["causeway-lag"]["static_configs"] for t in sc["targets"]]
    assert [t.split(":")[0] for t in lag] == ["lag-exporter"], "Prometheus must scrape the lag exporter"


def test_compose_runs_the_lag_exporter_and_workers_reachable_from_prometheus() -> None:
    services = _compose()["services"]
    assert services["lag-exporter"]["command"] == ["python", "-m", "monitoring.lag_exporter"]
    for name in ("worker", "lag-exporter"):
        # Bound to 127.0.0.1 inside a container, /metrics is unreachable from the prometheus container.
        assert services[name]["environment"]["CAUSEWAY_WEB_BIND"] == "0.0.0.0"
    assert "ports" not in services["worker"], "a published port would stop `--scale worker=N`"


def test_dockerfile_copies_only_existing_paths() -> None:
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), f"Dockerfile copies {src}, which does not exist"


def test_dockerfile_copies_every_installed_package() -> None:
    """`pip install .` in the image installs what pyproject's package list names: each must be copied."""
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    copied = {
        src.rstrip("/")
        for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("COPY ")
        for src in line.split()[1:-1]
    }
    missing = sorted(p.rstrip("*") for p in include if p.rstrip("*") not in copied)
    assert not missing, f"the image would install without {missing}: add COPY lines to the Dockerfile"
