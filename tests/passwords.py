"""Postgres roles with passwords, for the tests of passwords in database URLs: a role with a
database of its own, its URL written in either form a password can take, what counts as a
leak, and a server that checks passwords (a server that trusts local connections accepts
any password, so a right or wrong one proves nothing there).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

from tests.servers import free_port, give_to, program, run, run_as
from zerda_store import Store, migrate

# Two unencoded "@": SQLAlchemy alone ends the password at the first and takes
# "pw7Qz@rT9@127.0.0.1" for the host.
AT_SIGNS = "Hx4@pw7Qz@rT9"
PLAIN = "Qp7zXk2Lm9Tv"
WRONG = "Wr0ng@pa55@Xy7Z"


@dataclass(frozen=True)
class Form:
    """Where the URL holds the password ("userinfo": user:password@host, or "query":
    user@host/db?password=...), and which password; both written unencoded, as people do."""

    where: str
    password: str

    def __str__(self) -> str:
        return f"{self.where}-{'at-signs' if '@' in self.password else 'plain'}"


# (A plain password in the userinfo is the common case, covered by test_hostile_input.)
FORMS = (Form("userinfo", AT_SIGNS), Form("query", AT_SIGNS), Form("query", PLAIN))


def pieces(password: str) -> set[str]:
    """What must never be shown of a password: itself, encoded, and each part between its
    "@" signs (a wrong split shows those)."""
    return {password, quote(password, safe=""), quote_plus(password), *password.split("@")}


def leaks(text: str, *passwords: str) -> set[str]:
    """The pieces of ``passwords`` that ``text`` shows."""
    return {piece for password in passwords for piece in pieces(password) if piece in text}


@dataclass(frozen=True)
class RoleDatabase:
    """A login role whose password is its form's, and a database it owns."""

    user: str
    host: str
    port: int
    database: str
    form: Form

    def url(self, password: str | None = None, *, port: int | None = None) -> str:
        """The URL in the role's form, with its password or ``password``."""
        password = password or self.form.password
        where = f"{self.host}:{port or self.port}/{self.database}"
        if self.form.where == "userinfo":
            return f"postgresql://{self.user}:{password}@{where}"
        assert self.form.where == "query", self.form
        return f"postgresql://{self.user}@{where}?password={password}"

    def sqlalchemy_url(self) -> sa.URL:
        """The same URL built by SQLAlchemy (password encoded), for setting things up."""
        return sa.URL.create(
            "postgresql+psycopg",
            username=self.user,
            password=self.form.password,
            host=self.host,
            port=self.port,
            database=self.database,
        )


def create_role_database(
    admin: sa.Engine, form: Form, *, at_head: bool = True
) -> tuple[RoleDatabase, Callable[[], None]]:
    """A new role with the form's password and a database it owns on ``admin``'s server
    (the schema at head unless told not), and the function that drops them."""
    name = f"zerda_pw_{uuid.uuid4().hex[:12]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f"CREATE ROLE {name} LOGIN PASSWORD '{form.password}'")
        connection.exec_driver_sql(f'CREATE DATABASE "{name}" OWNER {name}')

    def drop() -> None:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            connection.exec_driver_sql(f"DROP ROLE IF EXISTS {name}")

    assert admin.url.host is not None
    role = RoleDatabase(name, admin.url.host, admin.url.port or 5432, name, form)
    if at_head:
        try:
            with Store(role.sqlalchemy_url()) as store:
                migrate.upgrade(store)
        except BaseException:
            drop()
            raise
    return role, drop


def checks_passwords(admin: sa.Engine) -> bool:
    """Whether ``admin``'s server refuses a wrong password over TCP."""
    role, drop = create_role_database(admin, FORMS[0], at_head=False)
    try:
        wrong = role.sqlalchemy_url().set(password=WRONG)
        engine = sa.create_engine(wrong, poolclass=sa.NullPool)
        try:
            with engine.connect():
                return False
        except sa.exc.OperationalError:
            return True
        finally:
            engine.dispose()
    finally:
        drop()


@contextmanager
def private_server() -> Iterator[sa.Engine]:
    """A throwaway Postgres cluster that asks every connection for a password
    (scram-sha-256), and an admin engine on it; stopped and deleted at the end."""
    initdb, pg_ctl = program("initdb"), program("pg_ctl")
    prefix = run_as()
    workdir = Path(tempfile.mkdtemp(prefix="zerda-pg-"))
    admin_password = uuid.uuid4().hex
    (workdir / "pwfile").write_text(admin_password)
    data, port = workdir / "data", free_port()
    if prefix:
        give_to(workdir, prefix[2])
    initialized = False
    try:
        init = [initdb, "-D", str(data), "-U", "postgres", "-E", "UTF8", "--no-sync"]
        run([*prefix, *init, "--auth=scram-sha-256", f"--pwfile={workdir / 'pwfile'}"])
        initialized = True
        options = f"-p {port} -k {workdir} -c listen_addresses=127.0.0.1 -c fsync=off"
        start = [pg_ctl, "-D", str(data), "-l", str(workdir / "log"), "-o", options, "-w", "start"]
        run([*prefix, *start])
        url = sa.URL.create(
            "postgresql+psycopg",
            username="postgres",
            password=admin_password,
            host="127.0.0.1",
            port=port,
            database="postgres",
        )
        engine = sa.create_engine(url, isolation_level="AUTOCOMMIT")
        try:
            yield engine
        finally:
            engine.dispose()
    finally:
        if initialized:  # stopping a server that did not start is harmless
            stop = [*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"]
            subprocess.run(stop, capture_output=True, timeout=120, check=False)
        shutil.rmtree(workdir, ignore_errors=True)


def everything_said(error: BaseException) -> str:
    """The traceback, str and repr of an error and of every error behind it (a suppressed
    context included: a debugger or a log handler can still reach it)."""
    said = ["".join(traceback.format_exception(error))]
    seen: BaseException | None = error
    while seen is not None:
        said += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(said)


def unusable_urls(form: Form) -> list[str]:
    """URLs with the form's password that cannot be used: a port that is not a number; ports
    of several hosts that are not numbers (refused when the engine is made)."""
    if form.where == "userinfo":
        return [
            f"postgresql://app:{form.password}@127.0.0.1:port/db",
            f"postgresql://app:{form.password}@/db?host=h1:x&host=h2",
        ]
    return [
        f"postgresql://app@127.0.0.1:port/db?password={form.password}",
        f"postgresql://app@/db?password={form.password}&host=h1:x&host=h2",
    ]


@contextmanager
def table_locked(admin: sa.Engine, role: RoleDatabase, table: str = "entities") -> Iterator[None]:
    """The admin holds an exclusive lock on a table of the role's database."""
    engine = sa.create_engine(admin.url.set(database=role.database), poolclass=sa.NullPool)
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            yield
            connection.rollback()
    finally:
        engine.dispose()


def lose_the_next_commit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next COMMIT on any psycopg connection reaches the server, then the connection
    dies before the answer arrives (the backend ends itself)."""
    commit = PGDialect_psycopg.do_commit

    def do_commit(dialect: PGDialect_psycopg, pooled_connection: Any) -> None:
        commit(dialect, pooled_connection)
        monkeypatch.setattr(PGDialect_psycopg, "do_commit", commit)
        pooled_connection.dbapi_connection.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    monkeypatch.setattr(PGDialect_psycopg, "do_commit", do_commit)
