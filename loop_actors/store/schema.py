"""Every table the runtime adds to a store's database, named once, with its definition.

The events and snapshots tables are eventsourcing's (its recorders name and create
them); the read models' tables are in ``projections.sql`` (the read models may not
import the runtime). What is here is the runtime's own: the store's identity, the
sealed secrets, the work queue and its holders, the rate limits, the schedules, and
the index of effects by invocation. Each definition is written once over
:class:`projections.dialect.Dialect`: both engines read the same statement, except where
a type is spelt differently.

These names are a stored format: a store written by an earlier version has these
tables under these names, and renaming one would orphan it.
"""

from __future__ import annotations

from collections.abc import Callable

from projections.dialect import Dialect

STORE_TABLE = "loop_actors_store"
"""The table of a store's identity: one row, created with the store."""

SECRETS_TABLE = "loop_actors_secrets"
"""The sealed secrets (see ``loop_actors.store.secrets``), in the store's own database."""

QUEUE_TABLE = "loop_actors_queue"
"""The work queue: a row per invocation submitted for the workers."""

HOLDERS_TABLE = "loop_actors_holders"
"""The processes that hold leases on the queue's rows, with their heartbeats."""

RATE_LIMITS_TABLE = "loop_actors_rate_limits"
"""The shared state of the providers' rate limits: a row per ``(provider, model)``."""

SCHEDULES_TABLE = "loop_actors_schedules"
"""The schedules (``loop-actors schedule add``): a row per schedule, with where it stands."""

EFFECT_INDEX = "loop_actors_effects_by_invocation"
"""The index of ``EffectPrepared`` rows by the invocation they belong to (SQLite stores)."""


def store_table_definition(table: str) -> str:
    """``CREATE TABLE`` of the store's identity (``table``: the name as the engine needs it)."""
    return (
        f"CREATE TABLE IF NOT EXISTS {table} ("
        "singleton INTEGER PRIMARY KEY CHECK (singleton = 1), "
        "store_id TEXT NOT NULL, created_at TEXT NOT NULL)"
    )


def secrets_table_definition(dialect: Dialect, table: str) -> str:
    """``CREATE TABLE`` of the sealed secrets (a sealed value is a BLOB, PostgreSQL's BYTEA)."""
    blob = "BYTEA" if dialect is Dialect.postgresql else "BLOB"
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (invocation_id TEXT NOT NULL, "
        "step INTEGER NOT NULL, call_id TEXT NOT NULL, kind TEXT NOT NULL, "
        f"sealed {blob} NOT NULL, PRIMARY KEY (invocation_id, step, call_id, kind))"
    )


def queue_definitions(name: Callable[[str], str] = str) -> tuple[str, ...]:
    """The queue's tables and indexes, in the order they are created (the same on both engines).

    ``name`` turns a table's name into what a statement writes (schema-qualified and
    quoted on a PostgreSQL store); an index takes the table's schema.
    """
    queue, holders, limits = name(QUEUE_TABLE), name(HOLDERS_TABLE), name(RATE_LIMITS_TABLE)
    schedules = name(SCHEDULES_TABLE)
    return (
        f"CREATE TABLE IF NOT EXISTS {queue} ("
        "invocation_id TEXT PRIMARY KEY, agent_name TEXT NOT NULL, agent_ref TEXT, "
        "status TEXT NOT NULL, holder TEXT, epoch INTEGER NOT NULL DEFAULT 0, "
        "due_at DOUBLE PRECISION NOT NULL, submitted_at DOUBLE PRECISION NOT NULL, "
        "updated_at DOUBLE PRECISION NOT NULL, note TEXT)",
        f"CREATE INDEX IF NOT EXISTS {QUEUE_TABLE}_due ON {queue} (status, due_at)",
        f"CREATE INDEX IF NOT EXISTS {QUEUE_TABLE}_holder ON {queue} (holder)",
        f"CREATE TABLE IF NOT EXISTS {limits} ("
        "provider TEXT NOT NULL, model TEXT NOT NULL, "
        "request_due DOUBLE PRECISION NOT NULL, token_due DOUBLE PRECISION NOT NULL, "
        "blocked_until DOUBLE PRECISION NOT NULL, PRIMARY KEY (provider, model))",
        # The timing is every_s, or cron in time_zone; waiting and submitting are JSON
        # lists (aggregates.schedules.Schedule); retry_at is NULL while nothing decided
        # is missing from the store.
        f"CREATE TABLE IF NOT EXISTS {schedules} ("
        "name TEXT PRIMARY KEY, agent_name TEXT NOT NULL, agent_ref TEXT, goal TEXT NOT NULL, "
        "every_s INTEGER, cron TEXT, time_zone TEXT, overlap TEXT NOT NULL, "
        "catch_up TEXT NOT NULL, state TEXT NOT NULL, next_due DOUBLE PRECISION NOT NULL, "
        "waiting TEXT NOT NULL, submitting TEXT NOT NULL, retry_at DOUBLE PRECISION, "
        "last_due DOUBLE PRECISION, runs INTEGER NOT NULL, skipped INTEGER NOT NULL, "
        "created_at DOUBLE PRECISION NOT NULL, updated_at DOUBLE PRECISION NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {SCHEDULES_TABLE}_due ON {schedules} (state, next_due)",
        # Last: a store that has this table has the others (they are created in this order).
        f"CREATE TABLE IF NOT EXISTS {holders} ("
        "holder TEXT PRIMARY KEY, kind TEXT NOT NULL, host TEXT NOT NULL, machine TEXT NOT NULL, "
        "pid INTEGER NOT NULL, pid_start TEXT, started_at DOUBLE PRECISION NOT NULL, "
        "heartbeat_at DOUBLE PRECISION NOT NULL, lease_s DOUBLE PRECISION NOT NULL, "
        "agents TEXT NOT NULL, concurrency INTEGER NOT NULL)",
    )


QUEUE_DEFINITIONS = queue_definitions()
"""The queue's definitions with the tables' plain names (the queue's own connection)."""
