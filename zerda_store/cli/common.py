"""What the ``zerda-store`` commands share: the URL and store, one-line errors, and
tables or JSON on standard output. Stored text in human-readable output is escaped
(:func:`escaped`) so that it cannot drive the operator's terminal.

The library is imported by the commands that use it, not here: ``zerda-store --help``
loads click and the commands' own modules only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ..errors import RefusedInput, StoreError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

    from .. import ConversationEntityMemory, Store
    from ..admin import AdminRepository

# Control characters (Unicode category Cc: C0, DEL, C1) move the cursor, retitle the window
# or start escape sequences; the bidi embeddings, overrides and isolates reorder the text
# around them.
_ACTING_ON_TERMINAL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(found: re.Match[str]) -> str:
    return found.group().encode("unicode_escape").decode("ascii")


def escaped(text: object) -> str:
    """``text`` with every character a terminal would act on written out visibly, as in a
    Python string literal (``\\x1b``, ``\\r``, ``\\n``, ``\\u202e``): stored text shows as
    text, on one line. Everything else, backslashes included, is left as it is."""
    return _ACTING_ON_TERMINAL.sub(_escape, str(text))


def print_text(text: str) -> None:
    """Print human-readable text: its own line breaks are kept, everything else a terminal
    would act on is escaped."""
    click.echo("\n".join(escaped(line) for line in text.split("\n")))


# The input rules' bounds that options check (``db.validation``'s MAX_COUNT and MAX_SECONDS,
# which a test holds these to), named here so that reading the options loads no engine.
MAX_COUNT = 2**31 - 1
MAX_SECONDS = 253_402_300_799


class Context:
    """What every command shares: the URL and options, and a store opened on first use.

    Reading commands open the store read-only and never create or migrate a database;
    commands that change an existing memory need a zerda_store database at head there (a
    missing SQLite file is an error, a schema behind head is refused); only the commands
    that bring data in (``db upgrade``, ``import``, ``copy``'s destination, ``demo``)
    create or upgrade one.
    """

    def __init__(
        self, database_url: str | None, *, read_only: bool = False, schema: str | None = None
    ) -> None:
        self.database_url = database_url
        self.read_only = read_only
        self.schema = schema
        self._store: Store | None = None
        self._urls: list[URL] = []

    def open(self, *, reading: bool) -> Store:
        from .. import Store

        if self._store is None:
            self._store = Store(
                self.database_url, read_only=self.read_only or reading, schema=self.schema
            )
        return self._store

    @property
    def store(self) -> Store:
        """The store for the commands that may create the schema (read-only with --read-only)."""
        return self.open(reading=False)

    def open_store(self, database_url: str | None) -> Store:
        """A store on ``database_url``, whose secrets :meth:`scrub` then masks (the caller
        closes it)."""
        from .. import Store

        url = Store.resolve_url(database_url)
        self._urls.append(url)
        return Store(url)

    def scrub(self, text: str) -> str:
        """``text`` with the secrets of every URL this command was given masked (the demo
        opens its own store on the main URL)."""
        from .. import Store

        urls = list(self._urls)
        with contextlib.suppress(StoreError):
            urls.append(Store.resolve_url(self.database_url))
        for url in urls:
            text = Store.mask_secrets(text, url)
        return text

    def reading_store(self) -> Store:
        """A read-only store on a zerda_store database at head."""
        from .. import migrate

        store = self.open(reading=True)
        migrate.ensure_schema(store, auto_migrate=False, create=False)
        return store

    def changing_store(self) -> Store:
        """A store on an existing zerda_store database at head, for changing what it
        holds: never created, never upgraded (a schema behind head is refused, naming
        `db upgrade`, which reports what its upgrade changes)."""
        from .. import migrate

        store = self.open(reading=False)
        store.require_file()
        migrate.ensure_schema(store, auto_migrate=False, create=False)
        return store

    def reader(self) -> AdminRepository:
        from ..admin import AdminRepository

        return AdminRepository(self.reading_store())

    def memory(self, session_id: str) -> ConversationEntityMemory:
        """A memory on the session for reading it."""
        from .. import ConversationEntityMemory

        return ConversationEntityMemory(store=self.reading_store(), session_id=session_id)

    def memory_knowing(
        self, session_id: str, name: str, *, reading: bool = True
    ) -> ConversationEntityMemory:
        """The session's memory, in the session's own key mode, in which NAME is an entity."""
        from .. import ConversationEntityMemory

        store = self.reading_store() if reading else self.changing_store()
        memory = ConversationEntityMemory.for_session(store, session_id)
        if name not in memory.entity_store:
            raise LookupError(f"no entity {name!r} in session {session_id!r}")
        return memory

    def session_memory(self, session_id: str) -> ConversationEntityMemory:
        """The session's memory on a writable store, in the session's own key mode, for
        changing it: expired rows not yet pruned are within reach (an erasure finds them)."""
        from .. import ConversationEntityMemory

        store = self.changing_store()
        store.check_writable()
        return ConversationEntityMemory.for_session(store, session_id)

    def repository(self) -> AdminRepository:
        """The operators' queries on an existing zerda_store database at head (as
        :meth:`changing_store`: a missing SQLite file is an error, not a new database)."""
        from ..admin import AdminRepository

        return AdminRepository(self.changing_store())

    def importing_repository(self) -> AdminRepository:
        """The operators' queries for bringing data in: an empty database of either
        backend gets zerda_store's schema first (:func:`migrate.prepare_for_new_data`)."""
        from .. import migrate
        from ..admin import AdminRepository

        migrate.prepare_for_new_data(self.store)
        return AdminRepository(self.store)

    def database_files(self) -> list[Path]:
        """The files of the SQLite database this command reads (the database, its journal,
        -wal and -shm); none for Postgres, or a URL that names no file."""
        from .. import Store

        url = Store.resolve_url(self.database_url)
        if url.get_backend_name() != "sqlite" or url.database in (None, "", ":memory:"):
            return []
        database = Path(str(url.database))
        suffixes = ("", "-wal", "-shm", "-journal")
        return [database.with_name(database.name + suffix) for suffix in suffixes]

    def database_files_exist(self) -> bool:
        """False for a SQLite URL whose file is not there (opening it would create it)."""
        files = self.database_files()
        return not files or files[0].is_file()

    def refuse_own_file(self, destination: str) -> None:
        """Refuse ``destination`` if it is the database this command reads, or one of its
        files: writing there would replace the database (``export -o memory.db``)."""
        target = Path(destination)
        for own in self.database_files():
            if _same_file(target, own):
                raise click.ClickException(
                    f"{destination} is a file of the database this command reads "
                    f"({own.name}): choose another destination (nothing was written)"
                )

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


class Checked(click.ParamType[str, Any]):
    """Text one of the library's input rules checks (``admin.ARGUMENT_RULES[rule]``) as it
    is parsed: a value it refuses is a usage error naming the option (exit 2), before the
    database is opened. A session id that no session can have is refused, not looked up."""

    name = "text"

    def __init__(self, rule: str, what: str) -> None:
        self.rule = rule
        self.what = what

    def convert(self, value: Any, param: Any, ctx: Any) -> str:
        from ..admin import ARGUMENT_RULES

        try:
            return ARGUMENT_RULES[self.rule](value, self.what)
        except (TypeError, ValueError) as exc:
            self.fail(str(exc), param, ctx)


SESSION_ID = Checked("session id", "a session id")
NAME = Checked("name", "a name")
ENTITY_TYPE = Checked("entity type", "an entity type")


def refusals_are_usage_errors(command: click.Command) -> None:
    """The rule of the exit codes (0 ok, 1 failure, 2 usage) for every command under
    ``command``: what the library refuses of the operator's arguments
    (:class:`~zerda_store.errors.RefusedInput`: a value outside the input rules, options
    that contradict each other) is a usage error, as click's own are: exit 2, under the
    command's usage line. Everything else that fails is a failure (exit 1,
    :class:`Group`): a database error, something not found, a refused merge."""
    if isinstance(command, click.Group):
        for subcommand in command.commands.values():
            refusals_are_usage_errors(subcommand)
    elif command.callback is not None:
        command.callback = _usage_errors(command.callback)


def _usage_errors(callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)
        except RefusedInput as exc:
            ctx = click.get_current_context()
            raise click.UsageError(escaped(_scrubbed(ctx, str(exc))), ctx) from None

    return run


class Group(click.Group):
    """Turns the expected failures into one line, with no secret of any URL in it (exit 1;
    a refusal of the operator's arguments is a usage error, exit 2:
    :func:`refusals_are_usage_errors`)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (StoreError, LookupError, ValueError) as exc:
            message = exc.args[0] if isinstance(exc, LookupError) and exc.args else exc
            raise click.ClickException(escaped(_scrubbed(ctx, str(message)))) from None
        except Exception as exc:
            converted = _one_line(ctx, exc)
            if converted is exc:
                raise
            raise converted from None


def _one_line(ctx: click.Context, exc: Exception) -> Exception:
    """The one-line error for a driver error or an Alembic refusal (a revision it does not
    know); ``exc`` itself for anything else. Their classes are looked up among the loaded
    modules: a command that never loaded SQLAlchemy or Alembic cannot have raised them."""
    sqlalchemy_errors = sys.modules.get("sqlalchemy.exc")
    if sqlalchemy_errors is not None and isinstance(exc, sqlalchemy_errors.DBAPIError):
        from ..errors import first_line

        detail = first_line(exc) if isinstance(ctx.obj, Context) else type(exc).__name__
        return click.ClickException(escaped(_scrubbed(ctx, f"database error: {detail}")))
    alembic_errors = sys.modules.get("alembic.util.exc")
    if alembic_errors is not None and isinstance(exc, alembic_errors.CommandError):
        return click.ClickException(escaped(_scrubbed(ctx, str(exc))))
    return exc


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same file on disk (a hard link, a symbolic
    link), or, for a file not there yet, the same resolved path."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def _scrubbed(ctx: click.Context, message: str) -> str:
    return ctx.obj.scrub(message) if isinstance(ctx.obj, Context) else message


def plural(count: int, noun: str) -> str:
    """``1 entity``, ``2 entities``, ``0 turns``: a count with its noun agreeing."""
    if count == 1:
        return f"1 {noun}"
    many = f"{noun[:-1]}ies" if noun.endswith("y") and noun[-2:-1] not in "aeiou" else f"{noun}s"
    return f"{count} {many}"


def when(timestamp: float | None) -> str:
    """A stored time as an operator reads it, in UTC and saying so (``--json`` gives the
    epoch seconds stored)."""
    if timestamp is None:
        return "-"
    moment = dt.datetime.fromtimestamp(timestamp, tz=dt.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Rows as a table under the column names, each cell escaped and on one line."""
    cells = [[escaped(row[column]) for column in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    click.echo("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        click.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def output(
    rows: Sequence[dict[str, Any]],
    as_json: bool,
    columns: Sequence[str],
    shown: Callable[[dict[str, Any]], dict[str, Any]] = lambda row: row,
) -> None:
    if as_json:
        click.echo(json.dumps(list(rows), ensure_ascii=False, indent=2))
    elif rows:
        print_table([shown(row) for row in rows], columns)
    else:
        click.echo("(none)")


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
yes_option = click.option(
    "--yes", is_flag=True, help="Go ahead without asking (needed when not on a terminal)."
)
dry_run_option = click.option(
    "--dry-run", is_flag=True, help="Say what would be deleted; delete nothing."
)


def on_terminal() -> bool:
    """Whether an operator can be asked: standard input and output are a terminal."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def go_ahead(what: str, yes: bool) -> None:
    """The confirmation of every destructive command (as ``db downgrade`` asks): with
    ``--yes``, go ahead; on a terminal, say ``what`` it will do and ask; elsewhere refuse,
    changing nothing."""
    if yes:
        return
    if not on_terminal():
        raise click.ClickException(
            f"{what}; pass --yes to do it (there is no terminal to ask on), or --dry-run "
            "to see it; nothing was changed"
        )
    print_text(f"{what}.")
    if not click.confirm("Go ahead?", default=False):
        raise click.ClickException("nothing was changed")


session_option = click.option(
    "--session", "session_id", type=SESSION_ID, required=True, help="The session id."
)


def require_session(obj: Context, session_id: str) -> None:
    if not obj.reader().session_exists(session_id):
        raise LookupError(f"no session {session_id!r} in this database")
