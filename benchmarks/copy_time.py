"""How long `zerda-store copy --to` Postgres takes for one large SQLite session, and the
copying process's peak memory.

    python -m benchmarks.copy_time [--turns 100000] [--source FILE.db]

A SQLite session "big" of that many turns (three entities each, a snippet per entity) is
saved with ``save_contexts`` (or taken from ``--source``, a file an earlier run kept with
``--keep``); then ``zerda-store copy --session big --to`` a new Postgres database runs in a
fresh process, timed from start to exit, which reports its peak resident memory. The
machine's load average is printed with the figures, as the time depends on it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from .databases import Databases, postgres_available
from .import_memory import _fill, _peak_kib


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=100_000)
    parser.add_argument("--source", help="a SQLite file holding the session 'big' already")
    parser.add_argument("--keep", help="keep the filled SQLite source at this path")
    args = parser.parse_args(argv)
    if postgres_available():
        print(postgres_available(), file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as folder, Databases("postgres", folder) as targets:
        source = args.source
        if source is None:
            with Databases("sqlite", folder) as sources:
                filled = sources.new("source")
                started = time.perf_counter()
                _fill(filled.url, "big", args.turns)
                print(f"filled {args.turns:,} turns in {time.perf_counter() - started:.0f} s")
                source = str(Path(folder) / "source.db")
                shutil.copy(filled.address, source)
            if args.keep:
                shutil.copy(source, args.keep)
        target = targets.new("target")
        at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        load = os.getloadavg()[0]
        started = time.perf_counter()
        peak = _peak_kib(
            *("--database-url", f"sqlite:///{source}", "copy", "--session", "big"),
            *("--to", target.url),
        )
        wall = time.perf_counter() - started
        print(
            f"{at}, load {load:.1f} (at the end {os.getloadavg()[0]:.1f}) on "
            f"{os.cpu_count()} cores: copy of {args.turns:,} turns to Postgres "
            f"{wall:.1f} s wall, peak RSS {peak / 1024:.0f} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
