"""Memory of `zerda-store import` and `copy` against the size of the session they move.

    python -m benchmarks.import_memory [--backend sqlite|postgres|both] [--turns 2000,20000]

For each size, a session of that many turns (three entities each, a snippet per entity) is
saved with ``save_contexts`` and exported; then ``zerda-store import`` of the file and
``zerda-store copy`` of the session each run in a fresh process, which reports its peak
resident memory. Flat means the peak hardly moves while the session grows tenfold.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from zerda_store import ConversationEntityMemory, Store

from .databases import Databases, postgres_available
from .workload import ScriptedLLM, make_turns

# Runs the command line in this process, then prints the process's peak RSS (KiB).
_MEASURED_CLI = (
    "import resource, sys\n"
    "from zerda_store.cli import main\n"
    "try:\n"
    "    main(sys.argv[1:], standalone_mode=False)\n"
    "finally:\n"
    "    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
)


def _peak_kib(*args: str) -> int:
    result = subprocess.run(
        [sys.executable, "-c", _MEASURED_CLI, *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "TQDM_DISABLE": "1"},
    )
    return int(result.stderr.strip().splitlines()[-1])


def _fill(url: str, session_id: str, count: int) -> None:
    llm = ScriptedLLM()
    turns = make_turns(count)
    llm.queue.extend(turn.answer for turn in turns)
    with Store(url) as store:
        memory = ConversationEntityMemory(llm, store=store, session_id=session_id)
        for start in range(0, count, 2_000):
            chunk = turns[start : start + 2_000]
            memory.save_contexts(
                ({"input": t.input_text}, {"output": t.output_text}) for t in chunk
            )


def measure(backend: str, sizes: list[int], folder: Path) -> list[tuple[int, float, int, int]]:
    """Per size: the export's size (MB) and the peak RSS (KiB) of an import and a copy."""
    rows = []
    with Databases(backend, str(folder)) as dbs:
        for size in sizes:
            source = dbs.new(f"source{size}")
            _fill(source.url, "big", size)
            export = folder / f"big-{backend}-{size}.jsonl"
            subprocess.run(
                [
                    *(sys.executable, "-m", "zerda_store", "--database-url", source.url),
                    *("export", "--session", "big", "-o", str(export)),
                ],
                check=True,
                capture_output=True,
            )
            imported = dbs.new(f"imported{size}")
            copied = dbs.new(f"copied{size}")
            import_peak = _peak_kib(
                "--database-url", imported.url, "import", str(export), "--session", "big"
            )
            copy_peak = _peak_kib("--database-url", source.url, "copy", "--to", copied.url)
            rows.append((size, export.stat().st_size / 1e6, import_peak, copy_peak))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--turns", default="2000,20000", help="session sizes, comma-separated")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.turns.split(",")]
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    if "postgres" in backends and postgres_available():
        backends.remove("postgres")
    print("| backend | turns | export | import peak RSS | copy peak RSS |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for backend in backends:
            for size, megabytes, import_peak, copy_peak in measure(backend, sizes, Path(folder)):
                print(
                    f"| {backend} | {size:,} | {megabytes:.1f} MB | {import_peak / 1024:.0f} MB "
                    f"| {copy_peak / 1024:.0f} MB |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
