"""The project's exception root and one base per area.

Every error causeway raises on purpose derives from :class:`CausewayError`, through the base of its
area, so a caller can catch by area (``except StorageError``) and code decides by type, never by a
class name or message text. Areas and where their concrete errors live:

* :class:`ConfigError` – settings and configuration files (``streams.settings.SettingsError``);
* :class:`InputError` – bad input a producer or operator can fix: invalid events, CDC envelopes and
  mappings, world ids, refused schema changes (``models``, ``cdc``);
* :class:`StorageError` – Nessie and the Iceberg warehouse (``sinks.errors``: ``NessieError`` and its
  subclasses), with :class:`CommitError` for the commit loop's own outcomes (``RetriesExhausted``,
  ``CommitStateUnknown``, ``BranchMissing``);
* :class:`BrokerError` – Kafka, :class:`MarksError` – Redis (for our own refusals; the client
  libraries raise their own types, which callers attribute to a dependency explicitly);
* :class:`WorldsError` – world management, reads, merges, publishes (``worlds``);
* :class:`OperatorError` – operator tools that refuse a request (``ops``: replay, offsets; reconcile scope);
* :class:`WorkerError` – the worker's own lifecycle (``agents``: ``StepAbandoned``, a step that gave up
  retrying because the worker stops or its partitions are revoked).

This module imports nothing of the project, so every layer may import it.
"""

from __future__ import annotations


class CausewayError(Exception):
    """Root of every error causeway raises on purpose."""


class ConfigError(CausewayError):
    """A setting or configuration file is invalid; the message names it and the fix."""


class InputError(CausewayError):
    """Input a producer or operator can fix (an event, envelope, mapping, id or schema change)."""


class SchemaError(InputError):
    """A schema change that cannot be applied as asked."""


class StorageError(CausewayError):
    """Nessie or the Iceberg warehouse failed or refused."""


class CommitError(StorageError):
    """A commit's own outcome: gave up after retries, outcome unknown, or no branch to commit to."""


class BrokerError(CausewayError):
    """Kafka refused or failed (topics, groups, offsets)."""


class MarksError(CausewayError):
    """Redis (dedupe marks, dead-letter decisions, checkpoints) refused or failed."""


class WorldsError(CausewayError):
    """A world operation that cannot be done; the message says why and what to do."""


class OperatorError(CausewayError):
    """An operator tool refused a request (replay range, offset reset, reconcile scope ...)."""


class WorkerError(CausewayError):
    """The worker gave up work on purpose (it stops, or a rebalance takes its partitions)."""
