"""How telemetry names things: the instrumentation scope, and a store's database as the
database conventions show it (no folder, no host, no secret)."""

from __future__ import annotations

import os
from typing import Any

INSTRUMENTATION_NAME = "zerda_store"
INSTRUMENTATION_VERSION = "0.1.0"
SCHEMA_URL = "https://opentelemetry.io/schemas/1.37.0"


def namespace_of(store: Any) -> str:
    """``db.namespace``: the Postgres database (``database|schema`` with a schema), or the
    SQLite file's name (no folder: paths may name people or hosts)."""
    database = store.url.database or ""
    if store.dialect == "sqlite":
        return os.path.basename(database) or ":memory:"
    schema = getattr(store, "schema", None)
    return f"{database}|{schema}" if schema else str(database)


def system_of(store: Any) -> str:
    """``db.system.name``: "sqlite" or "postgresql"."""
    return str(store.dialect)


def pool_name(store: Any) -> str:
    """The pool's name as the connection metrics show it: the database, no secret."""
    return f"{system_of(store)}:{namespace_of(store)}"
