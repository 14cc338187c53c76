"""Typed records: change events, dead letters, Debezium envelopes, world ids."""
