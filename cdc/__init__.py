"""Change data capture: Debezium envelopes, the table mapping, the pure conversion and batch plan.

The ingest loop that runs them against Kafka is ``agents/cdc.py`` (a streaming agent).
"""
