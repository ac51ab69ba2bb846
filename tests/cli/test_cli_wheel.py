"""The wheel as users get it: it carries the migrations and alembic.ini, and once installed
(with its postgres extra) in a fresh virtual environment, `zerda-store db upgrade`,
`db check`, `demo` and plain `alembic` work from a folder outside the repository, on
SQLite and on an empty Postgres database.

Building the wheel and installing its dependencies into a new environment takes some
seconds (and a package index or pip's cache), so the module is marked slow.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import zipfile
from contextlib import closing
from pathlib import Path

import pytest

from tests.doubles import new_postgres_database
from zerda_store import migrate
from zerda_store.db.connections.urls import DATABASE_URL_ENV

pytestmark = pytest.mark.slow

REPOSITORY = Path(__file__).resolve().parents[2]
PACKAGED_FILES = (
    "zerda_store/migrations/env.py",
    "zerda_store/migrations/versions/0001_initial.py",
    "zerda_store/alembic.ini",
)


def run(command: list[str], cwd: Path, env: dict[str, str], timeout: int = 300):
    result = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{command} failed:\n{result.stdout}\n{result.stderr}"
    return result


def clean_env(venv: Path | None = None) -> dict[str, str]:
    """The environment without anything that points at this checkout or its database."""
    hidden = {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", DATABASE_URL_ENV}
    env = {k: v for k, v in os.environ.items() if k not in hidden}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    if venv is not None:
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    run(
        [sys.executable, "-m", "pip", "wheel", str(REPOSITORY), "-w", str(dist), "--no-deps", "-q"],
        cwd=dist,
        env=clean_env(),
    )
    (built,) = dist.glob("zerda_store-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Path:
    """A fresh virtual environment with the wheel and its postgres extra installed, as the
    README's install section says."""
    where = tmp_path_factory.mktemp("venv") / "env"
    run([sys.executable, "-m", "venv", str(where)], cwd=where.parent, env=clean_env())
    run(
        [str(where / "bin" / "python"), "-m", "pip", "install", "-q", f"{wheel}[postgres]"],
        cwd=where.parent,
        env=clean_env(where),
    )
    return where


@pytest.fixture
def outside(tmp_path) -> Path:
    """A working folder that is not the repository."""
    folder = tmp_path / "work"
    folder.mkdir()
    assert REPOSITORY not in folder.parents
    return folder


def installed_package(venv: Path, cwd: Path) -> Path:
    found = run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import pathlib, zerda_store; print(pathlib.Path(zerda_store.__file__).parent)",
        ],
        cwd=cwd,
        env=clean_env(venv),
    )
    return Path(found.stdout.strip())


def revision_of(database: Path) -> str:
    with closing(sqlite3.connect(database)) as connection:
        return connection.execute("SELECT version_num FROM alembic_version").fetchone()[0]


def test_the_wheel_carries_the_migrations_and_alembic_ini(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())

    for packaged in PACKAGED_FILES:
        assert packaged in names
    revisions = {n for n in names if n.startswith("zerda_store/migrations/versions/")}
    shipped = {p.name for p in (REPOSITORY / "migrations" / "versions").glob("*.py")}
    assert {Path(n).name for n in revisions} == shipped


def test_the_installed_package_is_imported_from_the_venv_not_the_checkout(venv, outside):
    package = installed_package(venv, outside)

    assert venv in package.parents
    assert REPOSITORY not in package.parents
    migrations = run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "from zerda_store import migrate; print(migrate.migrations_dir())",
        ],
        cwd=outside,
        env=clean_env(venv),
    )
    assert Path(migrations.stdout.strip()) == package / "migrations"


def test_db_upgrade_and_check_work_from_the_installed_wheel_outside_the_repository(venv, outside):
    script = str(venv / "bin" / "zerda-store")
    url = f"sqlite:///{outside / 'crm.db'}"

    upgraded = run([script, "--database-url", url, "db", "upgrade"], outside, clean_env(venv))
    assert upgraded.stdout.strip().splitlines()[-1] == (
        f"database at revision {migrate.head_revision()}"
    )
    assert revision_of(outside / "crm.db") == migrate.head_revision()

    checked = run([script, "--database-url", url, "db", "check"], outside, clean_env(venv))
    assert "schema matches the code" in checked.stdout


def test_demo_runs_from_the_installed_wheel_on_the_default_file_in_the_working_folder(
    venv, outside
):
    script = str(venv / "bin" / "zerda-store")

    first = run([script, "demo"], outside, clean_env(venv))
    again = run([script, "demo"], outside, clean_env(venv))

    assert (outside / "zerda_store.db").is_file()
    assert revision_of(outside / "zerda_store.db") == migrate.head_revision()
    assert "A new, empty memory." in first.stdout
    assert "5 entities, 3 turns, 6 snippets stored in session 'demo'." in first.stdout
    assert "already holds 3 turns from earlier runs" in again.stdout
    assert "5 entities, 3 turns, 6 snippets" in again.stdout


def test_alembic_upgrades_with_the_packaged_alembic_ini(venv, outside):
    ini = installed_package(venv, outside) / "alembic.ini"
    alembic = [str(venv / "bin" / "alembic"), "-c", str(ini)]
    url = f"url=sqlite:///{outside / 'plain.db'}"

    run([*alembic, "-x", url, "upgrade", "head"], outside, clean_env(venv))
    current = run([*alembic, "-x", url, "current"], outside, clean_env(venv))

    assert revision_of(outside / "plain.db") == migrate.head_revision()
    assert f"{migrate.head_revision()} (head)" in current.stdout
    with closing(sqlite3.connect(outside / "plain.db")) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
    assert {"turns", "entities", "contexts", "extractions", "entity_overview"} <= tables


@pytest.mark.postgres
def test_db_upgrade_and_demo_on_an_empty_postgres_database_from_the_installed_wheel(
    venv, outside, postgres_admin
):
    script = str(venv / "bin" / "zerda-store")
    url, drop = new_postgres_database(postgres_admin)
    try:
        upgraded = run([script, "--database-url", url, "db", "upgrade"], outside, clean_env(venv))
        demo = run([script, "--database-url", url, "demo"], outside, clean_env(venv))
        current = run([script, "--database-url", url, "db", "current"], outside, clean_env(venv))
    finally:
        drop()

    assert upgraded.stdout.strip().endswith(f"database at revision {migrate.head_revision()}")
    assert "5 entities, 3 turns, 6 snippets stored in session 'demo'." in demo.stdout
    assert current.stdout.strip() == f"{migrate.head_revision()} (head)"
