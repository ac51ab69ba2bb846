"""Every command and subcommand of `zerda-store` explains itself."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterator

import click
import pytest

from tests.cli.helpers import invoke
from zerda_store.cli import main


def walk(command: click.Command, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from walk(sub, (*path, name))


def resolve(path: tuple[str, ...]) -> click.Command:
    command: click.Command = main
    for name in path:
        assert isinstance(command, click.Group)
        command = command.commands[name]
    return command


PATHS = list(walk(main))


def test_every_command_of_the_design_is_there():
    assert {" ".join(p) for p in PATHS} >= {
        "",
        "db",
        "db upgrade",
        "db downgrade",
        "db current",
        "db check",
        "sessions",
        "entities",
        "entity",
        "stats",
        "export",
        "import",
        "copy",
        "forget",
        "reextract",
        "models",
        "models download",
        "demo",
    }


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "zerda-store")
def test_help_text_and_help_option(path):
    command = resolve(path)
    assert (command.help or "").strip(), f"{path} has no help text"
    for parameter in command.params:
        if isinstance(parameter, click.Option) and parameter.name != "help":
            assert (parameter.help or "").strip(), f"{path} option {parameter.opts} has no help"

    # --help needs no database, not even a usable URL
    result = invoke("nosuchdb://x", *path, "--help")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Usage: ")
    first_line = command.help.strip().splitlines()[0]
    assert " ".join(first_line.split()) in " ".join(result.stdout.split())


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "zerda-store")
def test_dash_h_is_help_too(path):
    result = invoke("nosuchdb://x", *path, "-h")

    assert result.exit_code == 0, result.output
    assert result.stdout == invoke("nosuchdb://x", *path, "--help").stdout


def test_version_names_the_program_and_its_version():
    result = invoke("nosuchdb://x", "--version")

    assert result.exit_code == 0
    assert result.stdout == f"zerda-store, version {importlib.metadata.version('zerda-store')}\n"


# Every command that reports something; `export` writes its file (its report is the file),
# `models download` only says that it did.
REPORTING = {
    "db upgrade", "db downgrade", "db current", "db check", "sessions", "entities", "entity",
    "stats", "import", "copy", "forget", "reextract", "retention set", "retention show",
    "retention clear", "prune", "alias add", "alias remove", "alias list", "merge", "unmerge",
    "merges", "demo",
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REPORTING))
def test_every_reporting_command_prints_json_on_asking(name):
    command = resolve(tuple(name.split()))

    assert "--json" in {opt for p in command.params for opt in getattr(p, "opts", [])}
