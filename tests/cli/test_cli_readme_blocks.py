"""The README's shell blocks that the fourth hardening round found broken: the schema
migrations block runs as written (its URL set once, for every line), the wheel installed
is the one `pip wheel -w dist` builds, the stanza extra comes after the CPU build of
torch, and no install names a package index's `zerda-store`."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.cli.helpers import console_script

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


def _block_after(heading: str) -> str:
    start = README.index(heading)
    found = re.search(r"```bash\n(.*?)```", README[start:], re.S)
    assert found, f"no shell block after {heading!r}"
    return found.group(1)


def test_the_schema_migrations_block_runs_as_written(tmp_path):
    block = _block_after("### Schema migrations")
    url = f"sqlite:///{tmp_path / 'crm.db'}"
    script = block.replace("postgresql://app@db/crm", url)
    # A script has no terminal to ask on: the downgrade that asks is the one line left out.
    lines = [line for line in script.splitlines() if not line.rstrip().endswith("no terminal is")]
    bin_dir = str(Path(console_script()).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env.pop("ZERDA_STORE_DATABASE_URL", None)

    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(lines)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=tmp_path,
    )

    assert done.returncode == 0, done.stderr
    assert "applied 0001 (initial)" in done.stdout
    assert "schema matches the code" in done.stdout
    assert not (tmp_path / "zerda_store.db").exists()  # every line used the URL given


def test_every_wheel_installed_is_the_one_built_into_dist():
    built = re.findall(r"pip install '([^']*\.whl)", README)
    assert built and all(path.startswith("dist/") for path in built), built


def test_the_stanza_extra_is_installed_after_the_cpu_build_of_torch():
    install = _block_after("## Install")
    torch = install.index("download.pytorch.org/whl/cpu")
    assert torch < install.index("pip install '.[stanza]'")
    assert "zerda-store[" not in README  # not a published name
