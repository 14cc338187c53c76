"""Benchmark harness: causeway against the naive design and the machine's ceiling."""
