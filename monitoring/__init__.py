"""Prometheus metrics, alert rules and Grafana dashboards."""
