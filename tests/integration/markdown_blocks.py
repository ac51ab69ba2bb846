"""The Python blocks of the README and of docs/*.md, and how the documentation test runs them.

A block that cannot run alone says so on its first line, visibly, with the reason:
``# not runnable alone: the signature, with each parameter's default``. Every other block
runs as written, in a fresh process, in an empty working folder. A block that names a
database URL runs on each backend: its example URLs are replaced by the test database's,
which is also ``$ZERDA_STORE_DATABASE_URL``.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))
NOT_RUNNABLE = "# not runnable alone:"
# The URLs the examples use: a Postgres server of the reader's, and the SQLite default.
EXAMPLE_URLS = ("postgresql://app@db/crm", "sqlite:///zerda_store.db")
_FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Block:
    document: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{self.document}:{self.line}"

    @property
    def reason_not_runnable(self) -> str | None:
        first = self.code.splitlines()[0] if self.code.strip() else ""
        return first[len(NOT_RUNNABLE) :].strip() if first.startswith(NOT_RUNNABLE) else None

    @property
    def uses_a_url(self) -> bool:
        return any(url in self.code for url in EXAMPLE_URLS) or "DATABASE_URL" in self.code

    @property
    def creates_the_schema(self) -> bool:
        """Whether the block creates the schema itself (else the database is at head, as
        the README has the reader run `zerda-store db upgrade` first)."""
        return "auto_migrate=True" in self.code or not self.uses_a_url

    def expected_output(self) -> list[str]:
        """What the block says it prints: the comment lines that end it (the output of the
        last print, whole), and ``print(...)  # text`` (text somewhere in the output; an
        ``e.g.`` is an example, not checked)."""
        lines = self.code.rstrip("\n").splitlines()
        tail: list[str] = []
        while lines and lines[-1].startswith("#"):
            tail.insert(0, lines.pop()[2:])
        expected = ["\n".join(tail)] if tail else []
        for statement in ast.walk(ast.parse(self.code)):
            if isinstance(statement, ast.Expr) and _is_print(statement.value):
                line = self.code.splitlines()[statement.end_lineno - 1]
                comment = line.partition("  # ")[2]
                if comment and not comment.startswith("e.g."):
                    expected.append(comment)
        return expected


def _is_print(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print"


def python_blocks() -> list[Block]:
    found = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 2
            found.append(Block(str(document.relative_to(REPO_ROOT)), line, match.group(1)))
    return found


def run_block(code: str, folder: Path, database_url: str | None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh process in ``folder``, on the checkout's zerda_store, with the
    example URLs pointing at ``database_url`` (None: the SQLite default in ``folder``)."""
    env = {k: v for k, v in os.environ.items() if k != "ZERDA_STORE_DATABASE_URL"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    if database_url is not None:
        env["ZERDA_STORE_DATABASE_URL"] = database_url
        for url in EXAMPLE_URLS:
            code = code.replace(f'"{url}"', repr(database_url))
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
