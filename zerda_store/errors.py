"""The errors zerda_store raises about its database, and its refusals of what a caller
passed. Each message says what happened and what to do, and never holds a password."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of the errors zerda_store raises about its database."""


class DatabaseUnavailableError(StoreError):
    """The database cannot be reached or opened."""


class CommitOutcomeUnknownError(StoreError):
    """The connection was lost while committing, so whether the write landed is unknown."""


class CancelledAfterCommitError(CommitOutcomeUnknownError):
    """An async write was cancelled after its COMMIT had been sent, too late to stop it: it
    is stored. Raised instead of the cancellation, so that a cancelled call is never stored
    without its caller being told."""


class SchemaNotCurrentError(StoreError):
    """The database schema is not at the revision this version of zerda_store needs."""


class NotAStoreDatabaseError(SchemaNotCurrentError):
    """The database holds no zerda_store schema: it is empty, holds another application's
    tables, or (Postgres) has zerda_store's tables in a schema the connection does not use."""


class ReadOnlyStoreError(StoreError):
    """A write through a store opened with ``read_only=True`` (or on a database that refuses
    writes); nothing was written."""


class LockTimeoutError(StoreError):
    """A statement waited longer than the store's ``lock_timeout`` for a lock that another
    connection holds (a long transaction, or a forgotten ``psql`` session); nothing of the
    unit of work was stored."""


class SessionNotEmptyError(StoreError):
    """An import or copy into a session that already holds data, without merging."""


class KeyRulesMismatchError(StoreError, ValueError):
    """The session was keyed with other key rules than this memory's."""


class MergeError(StoreError, ValueError):
    """A merge or unmerge that cannot be done as asked; nothing was changed."""


class DatabaseError(StoreError):
    """The database refused or failed a statement for a reason no other class names; the
    message gives the database's own first line. Nothing of the failed call was stored."""


class PermissionDeniedError(DatabaseError):
    """The database role lacks a privilege on zerda_store's tables (Postgres SQLSTATE 42501);
    nothing was written."""


class StatementTimeoutError(DatabaseError):
    """The server cancelled a statement (Postgres SQLSTATE 57014): the role's or database's
    ``statement_timeout`` ran out, or an operator cancelled it; nothing of the call was
    stored."""


class PoolerModeError(DatabaseError):
    """The server lost statements the store had prepared on its connection: it is behind a
    transaction-mode pooler (PgBouncer) and the store was not opened with
    ``prepared_statements=False``. Nothing of the call was stored."""


class PoolExhaustedError(StoreError):
    """Every connection a store may open stayed in use for ``pool_timeout`` seconds: more
    calls at once than the store's pool (``async_pool_size``) serves. Nothing was run."""


def first_line(exc: BaseException) -> str:
    """The first line of a driver error (SQLAlchemy's wrapper adds the statement and a
    link), as it came, secrets and all: pass it through
    :meth:`Store.mask_secrets` before showing it."""
    detail = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return detail[0] if detail else type(exc).__name__


class RefusedInput(Exception):
    """Base of the refusals of what a caller passed: a value outside the input rules, or
    arguments that contradict each other. Raised before anything is read or written; the
    caller's mistake, not the database's (the command line exits 2 on it, as on any usage
    error). Each is also a ``ValueError`` or a ``TypeError``, as the input rules promise."""


class RefusedValueError(RefusedInput, ValueError):
    """A value the input rules refuse (an empty session id, a name holding a control
    character, a duration that is not positive), or arguments that contradict each other."""


class RefusedTypeError(RefusedInput, TypeError):
    """A value of a type the input rules refuse (a number where a name is due)."""


class DatabaseUrlError(StoreError, RefusedValueError):
    """A database URL that cannot be parsed, or that names a database zerda_store does not
    run on (``mysql://``); nothing was opened."""
