"""Stream agents (CDC ingest, change applier, schema sync, reconciler) and their pure decision logic."""
