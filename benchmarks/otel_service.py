"""The service benchmark untraced and traced, in paired interleaved blocks:

    python -m benchmarks.otel_service [--backend sqlite|postgres] [--customers 200]
        [--blocks 4] [--variants untraced,all,failures]

Each block runs :func:`benchmarks.service.one_run` (the README's FastAPI app, an async
model answering after ``--delay``) once per variant, the order rotating every block, so a
noisy neighbour weighs on all of them alike: ``untraced`` (no OpenTelemetry), ``all``
(``ZERDA_BENCH_OTEL=traces``: a tracer provider with a BatchSpanProcessor exporting
nowhere, every child span) and ``failures`` (the same with
``ZERDA_STORE_OTEL_CHILD_SPANS=failures``). Prints each block's requests/s, the server's
CPU per request and each traced variant's throughput over the untraced one, with the load
average before and after the block. docs/observability.md#cost.
"""

from __future__ import annotations

import argparse
import os
import time

from benchmarks import service

VARIANTS = {
    "untraced": {},
    "all": {"ZERDA_BENCH_OTEL": "traces", "ZERDA_STORE_OTEL_CHILD_SPANS": "all"},
    "failures": {"ZERDA_BENCH_OTEL": "traces", "ZERDA_STORE_OTEL_CHILD_SPANS": "failures"},
}


def load_average() -> str:
    with open("/proc/loadavg") as loadavg:
        return loadavg.read().split()[0]


def block(args: argparse.Namespace, order: list[str]) -> dict[str, dict[str, float]]:
    """One run of each variant, in ``order`` (the server inherits the environment)."""
    rows = {}
    for variant in order:
        for name in ("ZERDA_BENCH_OTEL", "ZERDA_STORE_OTEL_CHILD_SPANS"):
            os.environ.pop(name, None)
        os.environ.update(VARIANTS[variant])
        rows[variant] = service.one_run(
            args, "fastapi", args.backend, "async", args.delay, args.customers
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--customers", type=int, default=200)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--variants", default="untraced,all,failures")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--llm-workers", type=int, default=32)
    parser.add_argument("--pool-size", type=int, default=10)
    args = parser.parse_args()
    variants = args.variants.split(",")
    for number in range(args.blocks):
        shift = number % len(variants)
        order = variants[shift:] + variants[:shift]
        before = load_average()
        rows = block(args, order)
        untraced = rows.get("untraced")
        parts = [f"{time.strftime('%H:%M:%S')} load {before}->{load_average()}"]
        for variant in variants:
            row = rows[variant]
            ratio = (
                f" ({row['rps'] / untraced['rps']:.2f})" if untraced and row is not untraced else ""
            )
            parts.append(
                f"{variant} {row['rps']:.1f} req/s{ratio}, {row['cpu_ms']:.2f} ms CPU/req, "
                f"{row['errors']} errors"
            )
        print(" | ".join(parts), flush=True)


if __name__ == "__main__":
    main()
