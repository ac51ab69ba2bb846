"""Service throughput: a chat service on one shared Store, as a new user would build it.

An ASGI app (served by uvicorn on 127.0.0.1, in a child process) answers ``POST /chat``:
a new memory for the customer's session, ``aload_memory_variables``, a fake chat call of
300 ms (``asyncio.sleep``), then ``asave_context`` with the message id as
``idempotency_key``. Extraction is a fake LLM taking 0 or 200 ms, async (``agenerate``,
``asyncio.sleep``) or sync (``generate``, ``time.sleep``, on the store's LLM threads).

The load generator runs one client per customer (its own ``httpx.AsyncClient``), each
sending its next message as soon as the last is answered, and checks every answer's
recall exactly against the customer's own history: a snippet of another session, a lost
turn or a wrong order is an error. It prints requests/s against the ideal
``C / (0.3 s + two extraction calls)``, p50/p95/p99 latency and the errors::

    python -m benchmarks.service                      # everything, ~6 minutes
    python -m benchmarks.service --backend postgres --llm async --delay 0.2 --customers 200

Postgres comes from ``ZERDA_BENCH_POSTGRES_URL`` (an admin URL); each run makes a fresh
database and drops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from benchmarks.databases import POSTGRES_ADMIN_URL

CHAT_SECONDS = 0.3
NAME = re.compile(r"\b[A-Z][A-Za-z0-9]{2,}\b")
HEADER = "Previous information about {name}:"


# -- the service ------------------------------------------------------------------------


class AsyncFakeLLM:
    """An extraction model that answers after ``delay`` seconds, awaited on the loop."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    async def agenerate(self, prompt: str, max_tokens: int = 100) -> str:
        if self.delay:
            await asyncio.sleep(self.delay)
        return ", ".join(dict.fromkeys(NAME.findall(prompt)))


class SyncFakeLLM:
    """The same model behind a blocking ``generate``."""

    def __init__(self, delay: float) -> None:
        self.delay = delay

    def generate(self, prompt: str, max_tokens: int = 100) -> str:
        if self.delay:
            time.sleep(self.delay)
        return ", ".join(dict.fromkeys(NAME.findall(prompt)))


Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def make_app(url: str, llm: Any, llm_workers: int, pool_size: int = 10) -> Any:
    """A raw ASGI app: lifespan opens and closes the one Store; POST /chat is one turn."""
    from zerda_store import ConversationEntityMemory, Store

    state: dict[str, Any] = {}

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                store = Store(url, llm_workers=llm_workers, async_pool_size=pool_size)
                # Checks (SQLite: makes) the schema once, before the first request.
                ConversationEntityMemory(store=store, auto_migrate=True)
                state["store"] = store
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await state["store"].aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def chat(body: dict[str, Any]) -> dict[str, Any]:
        memory = ConversationEntityMemory(
            llm,
            store=state["store"],
            session_id=body["customer"],
            entity_extraction_prompt="{text}",
        )
        began = time.monotonic()
        recalled = await memory.aload_memory_variables({"input": body["text"]})
        loaded = time.monotonic()
        await asyncio.sleep(CHAT_SECONDS)  # the chat model
        answer = f"noted {body['message_id']}"
        chatted = time.monotonic()
        await memory.asave_context(
            {"input": body["text"]}, {"output": answer}, idempotency_key=body["message_id"]
        )
        phases = [loaded - began, chatted - loaded, time.monotonic() - chatted]
        return {"recalled": recalled["entity_info"], "answer": answer, "phases": phases}

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            status, payload = 200, await chat(json.loads(raw))
        except Exception as exc:
            status, payload = 500, {"error": f"{type(exc).__name__}: {exc}"}
        body = json.dumps(payload).encode()
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def serve(args: argparse.Namespace) -> None:
    import uvicorn

    llm = (AsyncFakeLLM if args.llm == "async" else SyncFakeLLM)(args.delay)
    app = make_app(args.url, llm, args.llm_workers, args.pool_size)
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
            if payload["recalled"] != customer.expected():
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


async def load(port: int, customers: int, warmup: float, duration: float) -> Run:
    run = Run()
    window = Window(customers, warmup, duration)
    people = [Customer(i) for i in range(customers)]
    await asyncio.gather(*(customer_loop(c, port, run, window) for c in people))
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
    args: argparse.Namespace, backend: str, llm: str, delay: float, c: int
) -> dict[str, Any]:
    with fresh_database(backend) as url:
        port = free_port()
        command = [
            sys.executable, "-m", "benchmarks.service", "serve", "--url", url,
            "--llm", llm, "--delay", str(delay), "--port", str(port),
            "--llm-workers", str(args.llm_workers), "--pool-size", str(args.pool_size),
        ]  # fmt: skip
        process = subprocess.Popen(command)
        try:
            wait_for_port(port, process)
            run = _run_loop(load(port, c, args.warmup, args.duration))
        finally:
            process.terminate()
            process.wait(30)
    ideal = c / (CHAT_SECONDS + 2 * delay)
    done = len(run.latencies)
    quantiles = statistics.quantiles(run.latencies, n=100) if done > 1 else [0.0] * 99
    return {
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
        "errors": len(run.errors),
        "mismatches": run.mismatches,
        "first_error": run.errors[0] if run.errors else "",
    }


def report(row: dict[str, Any]) -> None:
    print(
        f"| {row['backend']:8} | {row['llm']:5} | {row['delay'] * 1000:4.0f} ms | {row['customers']:4} "
        f"| {row['rps']:7.1f} | {row['ideal']:7.1f} | {row['percent']:5.1f}% "
        f"| {row['p50'] * 1000:6.0f} | {row['p95'] * 1000:6.0f} | {row['p99'] * 1000:6.0f} "
        f"| {row['errors']} | {row['mismatches']} "
        f"| {' / '.join(f'{p * 1000:.0f}' for p in row['server_p50'])} |",
        flush=True,
    )
    if row["first_error"]:
        print(f"  first error: {row['first_error']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    child = sub.add_parser("serve")
    child.add_argument("--url", required=True)
    child.add_argument("--port", type=int, required=True)
    for each in (parser, child):
        each.add_argument("--llm", choices=["async", "sync", "both"], default="both")
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
        "| backend  | llm   | extr.   | C    |   req/s |   ideal |  % ideal "
        "|    p50 |    p95 |    p99 | errors | recall mismatches "
        "| server p50 ms: load / chat / save |"
    )
    rows = []
    for backend in backends:
        for llm in llms:
            for delay in args.delay or [0.0, 0.2]:
                for c in args.customers or [10, 50, 200]:
                    rows.append(one_run(args, backend, llm, delay, c))
                    report(rows[-1])
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
