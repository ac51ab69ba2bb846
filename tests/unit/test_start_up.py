"""Importing zerda_store, and starting the command line for its help, loads only what they
use: no Alembic, no SQLAlchemy asyncio (nor its ORM) before a call needs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import zerda_store
from zerda_store.cli import main as cli_main
from zerda_store.db.connections import urls

HEAVY = ("alembic", "sqlalchemy", "sqlalchemy.orm", "sqlalchemy.ext.asyncio", "tqdm", "psycopg")


def _loaded_after(code: str) -> set[str]:
    """The heavy modules a fresh interpreter has loaded after running ``code``."""
    probe = (
        f"{code}\nimport json, sys\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_importing_the_package_loads_none_of_the_library() -> None:
    assert _loaded_after("import zerda_store") == set()


def test_the_api_loads_neither_alembic_nor_the_async_extension() -> None:
    loaded = _loaded_after("from zerda_store import ConversationEntityMemory, Store")
    assert "sqlalchemy" in loaded
    assert not loaded & {"alembic", "sqlalchemy.orm", "sqlalchemy.ext.asyncio", "tqdm"}


def test_the_help_of_the_command_line_loads_neither_the_database_nor_alembic() -> None:
    loaded = _loaded_after(
        "import sys\nsys.argv = ['zerda-store', '--help']\n"
        "from zerda_store.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )
    assert loaded == set()


@pytest.mark.parametrize("name", zerda_store.__all__)
def test_every_public_name_is_there_on_first_use(name: str) -> None:
    assert getattr(zerda_store, name) is not None


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        zerda_store.Nothing  # noqa: B018


def test_the_command_line_reads_the_engine_s_environment_variable() -> None:
    database_url = next(p for p in cli_main.params if p.name == "database_url")
    assert database_url.envvar == urls.DATABASE_URL_ENV


def test_the_command_line_checks_the_input_rules_bounds() -> None:
    from zerda_store import validation
    from zerda_store.cli import common

    assert (common.MAX_COUNT, common.MAX_SECONDS) == (validation.MAX_COUNT, validation.MAX_SECONDS)


def test_telemetry_is_exported_from_the_root_without_loading_opentelemetry() -> None:
    code = (
        "import sys, zerda_store\n"
        "assert 'zerda_store.telemetry' not in sys.modules\n"
        "from zerda_store import Telemetry\n"
        "from zerda_store.telemetry import Telemetry as Home\n"
        "assert Telemetry is Home and 'Telemetry' in zerda_store.__all__\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
