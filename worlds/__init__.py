"""World management: create, fork, list, delete (wave 2: merge, release, rollback)."""
