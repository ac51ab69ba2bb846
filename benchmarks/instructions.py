"""CPU instructions per call of zerda_store and of the floor, counted by valgrind's
callgrind: a figure that the machine's load does not move, for a shared machine on which
wall and CPU times swing between runs.

    python -m benchmarks.instructions [--backend sqlite] [--calls 200]

For each of zerda_store's save and load and the floor's, a fresh process under
``valgrind --tool=callgrind`` fills a database (300 turns, commits not waiting for fsync),
then runs ``--calls`` calls inside one call through ctypes; callgrind counts only inside
that call (``--toggle-collect=ffi_call``), so start-up and filling are left out. The
driver's and SQLite's own instructions are counted (they run in the process); on Postgres
the server's are not. Each process takes a minute or more.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile

from .databases import Databases
from .floor import open_floor
from .turns import SESSION, ZerdaTurns
from .workload import make_queries, make_turns

FILLED_TURNS = 300
WARM_LOADS = 20


def run_calls(backend: str, side: str, op: str, calls: int) -> None:
    """Fill a database, then make ``calls`` calls of ``op`` inside one ctypes call."""
    with Databases(backend) as dbs:
        zerda = ZerdaTurns(dbs.get("zerda"), durable=False) if side == "zerda" else None
        floor = open_floor(dbs.get("floor"), durable=False) if side == "floor" else None
        turns = make_turns(FILLED_TURNS + calls)
        queries = make_queries(FILLED_TURNS + calls)
        save = zerda.save if zerda else lambda turn: floor.save(SESSION, turn)  # type: ignore[union-attr]
        load = zerda.load if zerda else lambda query: floor.load(SESSION, query.names)  # type: ignore[union-attr]
        for turn in turns[:FILLED_TURNS]:
            save(turn)
        for query in queries[:WARM_LOADS]:
            load(query)
        items, work = (turns, save) if op == "save" else (queries, load)

        def counted() -> int:
            for item in items[FILLED_TURNS:]:
                work(item)  # type: ignore[operator]
            return 0

        ctypes.CFUNCTYPE(ctypes.c_int)(counted)()
        (zerda or floor).close()  # type: ignore[union-attr]


def instructions(backend: str, side: str, op: str, calls: int) -> int:
    """Instructions per call, from a fresh process under callgrind."""
    with tempfile.TemporaryDirectory() as folder:
        command = [
            "valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/out",
            "--collect-atstart=no", "--toggle-collect=ffi_call",
            sys.executable, "-m", "benchmarks.instructions", "--run",
            backend, side, op, str(calls),
        ]  # fmt: skip
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError("callgrind reported no count:\n" + done.stderr[-2000:])
    return int(found.group(1)) // calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--run", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.run:
        backend, side, op, calls = args.run
        run_calls(backend, side, op, int(calls))
        return 0
    print("| call | zerda_store | floor | ratio |\n|---|---|---|---|")
    for op in ("save", "load"):
        mine = instructions(args.backend, "zerda", op, args.calls)
        floor = instructions(args.backend, "floor", op, args.calls)
        print(f"| {op} | {mine:,} | {floor:,} | {mine / floor:.2f}× |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
