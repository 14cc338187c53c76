"""Operator tools, one subpackage per tool: ``plan`` (pure decisions) and ``run`` (its I/O)."""
