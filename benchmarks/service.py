"""Service throughput: a chat service on one shared Store, as a new user would build it.

The FastAPI app as docs/async.md writes it (served by uvicorn on 127.0.0.1, in a child
process; :mod:`benchmarks.service_apps`) answers ``POST /chat``: a new memory for the
customer's session, ``aload_memory_variables``, a fake chat call of 300 ms
(``asyncio.sleep``), then ``asave_context`` with the message id as ``idempotency_key``.
Extraction is a fake LLM taking 0 or 200 ms, async (``agenerate``, ``asyncio.sleep``) or
sync (``generate``, ``time.sleep``, on the store's LLM threads). In the same run, the
control: the same app with the memory calls replaced by the extraction calls they make.

The load generator runs one client per customer (its own ``httpx.AsyncClient``), each
sending its next message as soon as the last is answered, and checks every answer's
recall exactly against the customer's own history: a snippet of another session, a lost
turn or a wrong order is an error. It prints requests/s against the ideal
``C / (0.3 s + two extraction calls)`` for the app and its control, their ratio, the
server's CPU per request (the memory's share: the app's minus the control's),
p50/p95/p99 latency and the errors::

    python -m benchmarks.service                      # async LLM, both backends, ~8 minutes
    python -m benchmarks.service --backend postgres --delay 0.2 --customers 200
    python -m benchmarks.service --apps asgi --llm sync    # the raw ASGI app, a sync LLM

Postgres comes from ``ZERDA_BENCH_POSTGRES_URL`` (an admin URL); each run makes a fresh
database and drops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from benchmarks import service_apps
from benchmarks.databases import POSTGRES_ADMIN_URL
from benchmarks.service_apps import CHAT_SECONDS, AsyncFakeLLM, SyncFakeLLM

HEADER = "Previous information about {name}:"
# The server's CPU time (user + system) is read from /proc in clock ticks.
TICKS = os.sysconf("SC_CLK_TCK")


# -- the service ------------------------------------------------------------------------


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    if os.environ.get("ZERDA_BENCH_OTEL"):  # the memory traced: docs/observability.md
        from benchmarks.otel_setup import configure

        configure(os.environ["ZERDA_BENCH_OTEL"])

    llm = (AsyncFakeLLM if args.llm == "async" else SyncFakeLLM)(args.delay)
    app = service_apps.make(args.app, args.url, llm, args.llm_workers, args.pool_size)
    uvicorn.run(
        app, host="127.0.0.1", port=args.port, log_level="warning", lifespan="on", backlog=4096
    )


# -- the load generator -----------------------------------------------------------------


@dataclass
class Customer:
    """One customer's conversation, and the recall each next message must get."""

    number: int
    session: str = field(init=False)
    turns: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.session = f"customer-{self.number:04d}-{uuid.uuid4().hex[:6]}"

    def message(self, n: int) -> tuple[str, str]:
        # Acme is in every session: a snippet from another session would show under it.
        return f"{self.session}-m{n}", f"Client{self.number} asks Acme about order {n}"

    def expected(self) -> str:
        recent = self.turns[-3:]
        if not recent:
            return ""
        blocks = [
            HEADER.format(name=name) + "\n" + "\n".join(recent)
            for name in (f"Client{self.number}", "Acme")
        ]
        return "\n\n".join(blocks)


@dataclass
class Run:
    latencies: list[float] = field(default_factory=list)
    phases: list[list[float]] = field(default_factory=list)  # load, chat, save (server side)
    errors: list[str] = field(default_factory=list)
    mismatches: int = 0
    server_cpu: float = 0.0  # the server's CPU seconds inside the measured window


class Window:
    """The measured window: it opens once every client has had one answer (connections
    made, first requests served), plus the warm-up, and lasts ``duration`` seconds."""

    def __init__(self, customers: int, warmup: float, duration: float) -> None:
        self.waiting = customers
        self.warmup = warmup
        self.duration = duration
        self.opened = asyncio.Event()
        self.start = self.stop = float("inf")

    def ready(self) -> None:
        self.waiting -= 1
        if self.waiting == 0:
            self.start = time.monotonic() + self.warmup
            self.stop = self.start + self.duration
            self.opened.set()


async def customer_loop(customer: Customer, port: int, run: Run, window: Window) -> None:
    limits = {"timeout": 60.0}
    async with httpx_client(limits) as client:
        n = 0
        while time.monotonic() < window.stop:
            message_id, text = customer.message(n)
            began = time.monotonic()
            try:
                response = await client.post(
                    f"http://127.0.0.1:{port}/chat",
                    json={"customer": customer.session, "message_id": message_id, "text": text},
                )
                payload = response.json()
            except Exception as exc:
                run.errors.append(f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(0.1)
                continue
            ended = time.monotonic()
            if response.status_code != 200:
                run.errors.append(payload.get("error", str(response.status_code)))
                continue
            if payload["recalled"] is not None and payload["recalled"] != customer.expected():
                run.mismatches += 1
                if run.mismatches <= 3:
                    print(f"  recall mismatch for {customer.session}: {payload['recalled']!r}")
            customer.turns.append(f"{text} {payload['answer']}")
            n += 1
            if window.start <= ended <= window.stop:  # answered inside the measured window
                run.latencies.append(ended - began)
                run.phases.append(payload["phases"])
            if n == 1:
                window.ready()
                await window.opened.wait()


@contextlib.asynccontextmanager
async def httpx_client(options: dict[str, Any]) -> AsyncIterator[Any]:
    import httpx

    async with httpx.AsyncClient(
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), **options
    ) as client:
        yield client


def cpu_seconds(pid: int) -> float:
    """A process's CPU time so far (user + system), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def server_cpu(pid: int, run: Run, window: Window) -> None:
    await window.opened.wait()
    await asyncio.sleep(max(0.0, window.start - time.monotonic()))
    began = cpu_seconds(pid)
    await asyncio.sleep(max(0.0, window.stop - time.monotonic()))
    run.server_cpu = cpu_seconds(pid) - began


async def load(port: int, pid: int, customers: int, warmup: float, duration: float) -> Run:
    run = Run()
    window = Window(customers, warmup, duration)
    people = [Customer(i) for i in range(customers)]
    await asyncio.gather(
        server_cpu(pid, run, window), *(customer_loop(c, port, run, window) for c in people)
    )
    return run


# -- databases and processes ------------------------------------------------------------


@contextlib.contextmanager
def fresh_database(backend: str) -> Any:
    if backend == "sqlite":
        folder = tempfile.mkdtemp(prefix="zerda_service_")
        yield f"sqlite:///{folder}/service.db"
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)
        return
    admin = sa.create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"zerda_service_{uuid.uuid4().hex[:10]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        url = sa.make_url(POSTGRES_ADMIN_URL).set(database=name)
        # Postgres needs the schema before the first memory (no auto-migration there).
        from zerda_store import Store, migrate

        with Store(url) as store:
            migrate.upgrade(store)
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def _run_loop(main: Awaitable[Run]) -> Run:
    """uvloop when installed (``pip install '.[bench]'`` in a checkout), as uvicorn picks it too."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)  # type: ignore[arg-type]
    return uvloop.run(main)  # type: ignore[no-any-return]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("the service exited at startup")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    raise RuntimeError("the service did not start")


def one_run(
    args: argparse.Namespace, app: str, backend: str, llm: str, delay: float, c: int
) -> dict[str, Any]:
    with fresh_database(backend) as url:
        port = free_port()
        command = [
            sys.executable, "-m", "benchmarks.service", "serve", "--url", url, "--app", app,
            "--llm", llm, "--delay", str(delay), "--port", str(port),
            "--llm-workers", str(args.llm_workers), "--pool-size", str(args.pool_size),
        ]  # fmt: skip
        process = subprocess.Popen(command)
        try:
            wait_for_port(port, process)
            run = _run_loop(load(port, process.pid, c, args.warmup, args.duration))
        finally:
            process.terminate()
            process.wait(30)
    ideal = c / (CHAT_SECONDS + 2 * delay)
    done = len(run.latencies)
    quantiles = statistics.quantiles(run.latencies, n=100) if done > 1 else [0.0] * 99
    return {
        "app": app,
        "backend": backend,
        "llm": llm,
        "delay": delay,
        "customers": c,
        "rps": done / args.duration,
        "ideal": ideal,
        "percent": 100 * done / args.duration / ideal,
        "p50": quantiles[49],
        "p95": quantiles[94],
        "p99": quantiles[98],
        "server_p50": [statistics.median(p) if p else 0.0 for p in zip(*run.phases, strict=True)],
        "cpu_ms": 1000 * run.server_cpu / done if done else 0.0,
        "errors": len(run.errors),
        "mismatches": run.mismatches,
        "first_error": run.errors[0] if run.errors else "",
    }


def report(row: dict[str, Any]) -> None:
    print(
        f"| {row['app']:7} | {row['backend']:8} | {row['llm']:5} | {row['delay'] * 1000:4.0f} ms "
        f"| {row['customers']:4} | {row['rps']:7.1f} | {row['ideal']:7.1f} | {row['percent']:5.1f}% "
        f"| {row['cpu_ms']:5.2f} "
        f"| {row['p50'] * 1000:6.0f} | {row['p95'] * 1000:6.0f} | {row['p99'] * 1000:6.0f} "
        f"| {row['errors']} | {row['mismatches']} "
        f"| {' / '.join(f'{p * 1000:.0f}' for p in row['server_p50'])} |",
        flush=True,
    )
    if row["first_error"]:
        print(f"  first error: {row['first_error']}", flush=True)


def report_ratio(app: dict[str, Any], control: dict[str, Any]) -> None:
    """The app against its control in the same run: throughput ratio, the memory's CPU."""
    ratio = app["rps"] / control["rps"] if control["rps"] else 0.0
    print(
        f"  {app['app']} / control: {100 * ratio:.1f}% of the control's throughput; "
        f"the memory's share of server CPU: {app['cpu_ms'] - control['cpu_ms']:.2f} ms/request",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("serve")
    child.add_argument("--url", required=True)
    child.add_argument("--port", type=int, required=True)
    child.add_argument("--app", choices=["fastapi", "control", "asgi"], default="fastapi")
    parser.add_argument(
        "--apps", choices=["fastapi", "asgi"], default="fastapi", help="measured with a control"
    )
    for each in (parser, child):
        each.add_argument("--llm", choices=["async", "sync", "both"], default="async")
        each.add_argument("--delay", type=float, action="append")
        each.add_argument("--llm-workers", type=int, default=32)
        each.add_argument("--pool-size", type=int, default=10)
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--customers", type=int, action="append")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.command == "serve":
        args.delay = args.delay[0]
        serve(args)
        return
    backends = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    llms = ["async", "sync"] if args.llm == "both" else [args.llm]
    print(
        "| app     | backend  | llm   | extr.   | C    |   req/s |   ideal |  % ideal "
        "| CPU ms/req |    p50 |    p95 |    p99 | errors | recall mismatches "
        "| server p50 ms: load / chat / save |"
    )
    rows = []
    for backend in backends:
        for llm in llms:
            for delay in args.delay or [0.0, 0.2]:
                for c in args.customers or [10, 50, 200]:
                    for app in (args.apps, "control"):
                        rows.append(one_run(args, app, backend, llm, delay, c))
                        report(rows[-1])
                    report_ratio(rows[-2], rows[-1])
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
