"""Telemetry (docs/observability.md): the spans, metrics and log lines of the memory's
operations, read back through the OpenTelemetry SDK's in-memory exporter and reader."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import StatusCode

from tests.doubles import AsyncKeywordLLM, BrokenLLM, KeywordLLM
from zerda_store import ConversationEntityMemory, LockTimeoutError, Store, StoreError
from zerda_store.db.execution import unit_of_work
from zerda_store.db.store import core_of
from zerda_store.telemetry import Telemetry
from zerda_store.telemetry.operations import UPDATE, observed

NAMES = ["Sarah", "Acme"]
SESSION = "customer-4711@example.com"


class Recorded:
    """The SDK's in-memory span exporter and metric reader behind one Telemetry."""

    def __init__(self, *, record_content: bool = False, child_spans: str = "all") -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.telemetry = Telemetry(
            record_content=record_content,
            tracer_provider=self.tracer_provider,
            meter_provider=self.meter_provider,
            child_spans=child_spans,
        )

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.spans() if span.name.startswith(name)]

    def metrics(self) -> dict[str, list[Any]]:
        """Each metric's data points, by name."""
        found: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found


@pytest.fixture
def recorded() -> Recorded:
    return Recorded()


@pytest.fixture
def store(database_url: str, recorded: Recorded) -> Iterator[Store]:
    with Store(database_url, telemetry=recorded.telemetry) as store:
        yield store


def children(recorded: Recorded, parent: ReadableSpan) -> list[ReadableSpan]:
    assert parent.context is not None
    return [
        span
        for span in recorded.spans()
        if span.parent is not None and span.parent.span_id == parent.context.span_id
    ]


def system(database_url: str) -> str:
    return "sqlite" if database_url.startswith("sqlite") else "postgresql"


def test_a_sync_save_and_recall_are_spans_with_their_extraction_and_unit_of_work(
    store: Store, recorded: Recorded, database_url: str
) -> None:
    memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), store=store, session_id=SESSION)
    memory.save_context({"input": "Sarah works at Acme"}, {"output": "Noted."})
    memory.load_memory_variables({"input": "What about Sarah?"})

    (save,) = recorded.named("update_memory")
    (recall,) = recorded.named("search_memory")
    for span, operation in ((save, "update_memory"), (recall, "search_memory")):
        attributes = dict(span.attributes or {})
        assert span.name == f"{operation} {attributes['gen_ai.memory.store.id']}"
        assert attributes["gen_ai.operation.name"] == operation
        assert attributes["db.system.name"] == system(database_url)
        assert attributes["gen_ai.conversation.id"] != SESSION
        assert len(str(attributes["gen_ai.conversation.id"])) == 16
        assert span.parent is None
        kinds = sorted(child.name.split()[0] for child in children(recorded, span))
        assert "extract_entities" in kinds
        assert {"read", "write"} & set(kinds)
    assert dict(save.attributes or {})["gen_ai.memory.record.count"] == 2
    assert dict(recall.attributes or {})["gen_ai.memory.record.count"] == 1
    (unit,) = [c for c in children(recorded, save) if c.name.startswith("write")]
    assert dict(unit.attributes or {})["db.operation.name"] == "write"
    assert dict(unit.attributes or {})["zerda_store.unit_of_work.attempts"] == 1


def test_async_spans_nest_under_the_callers_span_across_the_database_threads(
    store: Store, recorded: Recorded
) -> None:
    tracer = recorded.tracer_provider.get_tracer("test")
    memory = ConversationEntityMemory(llm=AsyncKeywordLLM(NAMES), store=store, session_id=SESSION)

    async def turn() -> None:
        with tracer.start_as_current_span("request"):
            await memory.aload_memory_variables({"input": "Sarah?"})
            await memory.asave_context(
                {"input": "Sarah works at Acme"}, {"output": "ok"}, idempotency_key="k1"
            )
            await memory.aforget_entity("Acme")

    asyncio.run(turn())
    (request,) = recorded.named("request")
    operations = children(recorded, request)
    assert sorted(span.name.split()[0] for span in operations) == [
        "delete_memory",
        "search_memory",
        "update_memory",
    ]
    assert {span.context.trace_id for span in recorded.spans()} == {request.context.trace_id}
    for operation in operations:
        units = [c for c in children(recorded, operation) if c.name.split()[0] in ("read", "write")]
        assert units, operation.name
    (save,) = recorded.named("update_memory")
    assert dict(save.attributes or {})["zerda_store.operation"] == "asave_context"


def test_a_failing_call_sets_error_status_and_type(store: Store, recorded: Recorded) -> None:
    memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), store=store, session_id=SESSION)
    memory.save_context({"input": "Sarah"}, {"output": "ok"})
    store.close()
    with pytest.raises(StoreError):
        memory.load_memory_variables({"input": "Sarah"})
    failed = [s for s in recorded.spans() if s.status.status_code is StatusCode.ERROR]
    assert sorted(s.name.split()[0] for s in failed) == ["read", "search_memory"]
    assert {dict(s.attributes or {})["error.type"] for s in failed} == {"StoreError"}
    points = recorded.metrics()["gen_ai.client.operation.duration"]
    assert any(dict(p.attributes).get("error.type") == "StoreError" for p in points)


def test_a_lock_timeout_is_an_error_on_the_unit_of_work_and_counted(
    sqlite_url: str, recorded: Recorded
) -> None:
    with Store(sqlite_url, telemetry=recorded.telemetry, lock_timeout=0.2) as store:
        memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), store=store, session_id=SESSION)
        holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(LockTimeoutError):
                memory.save_context({"input": "Sarah"}, {"output": "ok"})
        finally:
            holder.execute("ROLLBACK")
            holder.close()
    (save,) = recorded.named("update_memory")
    assert save.status.status_code is StatusCode.ERROR
    assert dict(save.attributes or {})["error.type"] == "LockTimeoutError"
    (unit,) = [c for c in children(recorded, save) if c.name.startswith("write")]
    assert unit.status.status_code is StatusCode.ERROR
    (timeouts,) = recorded.metrics()["zerda_store.lock.timeouts"]
    assert timeouts.value == 1


def test_metrics_after_a_known_workload(store: Store, recorded: Recorded) -> None:
    memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), store=store, session_id=SESSION)
    for text in ("Sarah joined", "Sarah works at Acme", "Acme grew"):
        memory.save_context({"input": text}, {"output": "ok"})
    memory.load_memory_variables({"input": "Sarah and Acme"})
    memory.load_memory_variables({"input": "nobody"})
    broken = ConversationEntityMemory(llm=BrokenLLM(), store=store, session_id="other")
    broken.save_context({"input": "Sarah"}, {"output": "ok"})

    metrics = recorded.metrics()
    durations = {
        dict(p.attributes)["zerda_store.operation"]: p.count
        for p in metrics["gen_ai.client.operation.duration"]
    }
    assert durations == {"save_context": 4, "load_memory_variables": 2}
    (entities,) = metrics["zerda_store.recall.entities"]
    assert (entities.count, entities.sum) == (2, 2)
    (snippets,) = metrics["zerda_store.recall.snippets"]
    assert (snippets.count, snippets.sum) == (2, 4)  # Sarah: 2 snippets, Acme: 2
    (failures,) = metrics["zerda_store.extraction.failures"]
    assert failures.value == 1
    writes = [
        p
        for p in metrics["db.client.operation.duration"]
        if dict(p.attributes)["db.operation.name"] == "write"
    ]
    assert sum(p.count for p in writes) == 4
    states = {
        dict(p.attributes)["db.client.connection.state"]: p.value
        for p in metrics["db.client.connection.count"]
    }
    assert set(states) == {"idle", "used"} and states["used"] == 0


def test_prune_counts_what_it_deleted_and_the_backlog_it_saw(
    store: Store, recorded: Recorded
) -> None:
    memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), store=store, session_id=SESSION)
    for n in range(3):
        memory.save_context({"input": f"Sarah, turn {n}"}, {"output": "ok"})
    memory.set_retention(keep_last=1)
    assert memory.prune(dry_run=True)["snippets"] == 2
    (backlog,) = recorded.metrics()["zerda_store.retention.backlog"]
    assert backlog.value == 2
    assert memory.prune()["snippets"] == 2
    metrics = recorded.metrics()
    (backlog,) = metrics["zerda_store.retention.backlog"]
    assert backlog.value == 0
    pruned = {
        dict(p.attributes)["zerda_store.retention.kind"]: p.value
        for p in metrics["zerda_store.retention.pruned"]
    }
    assert pruned == {"snippets": 2}
    prunes = [s for s in recorded.named("delete_memory")]
    assert [dict(s.attributes or {})["zerda_store.result.snippets"] for s in prunes] == [2, 2]


def every_recorded_text(recorded: Recorded, logs: list[logging.LogRecord]) -> str:
    """Every attribute of every exported span, span event and metric point, and every log
    line with its fields, as one text."""
    parts: list[str] = []
    for span in recorded.spans():
        parts += [span.name, json.dumps(dict(span.attributes or {}), default=str)]
        for event in span.events:
            parts += [event.name, json.dumps(dict(event.attributes or {}), default=str)]
        parts.append(str(span.status.description))
    for name, points in recorded.metrics().items():
        parts.append(name)
        parts += [json.dumps(dict(p.attributes), default=str) for p in points]
    for record in logs:
        parts += [record.getMessage(), json.dumps(record.__dict__, default=str)]
    return "\n".join(parts)


SECRET_TURN = "Zyxwvuta Qwertyson told me her passport number is 99-1234"
SECRET_NAMES = ["Zyxwvuta Qwertyson", "Blorptech"]


def run_everything(store: Store) -> None:
    memory = ConversationEntityMemory(llm=KeywordLLM(SECRET_NAMES), store=store, session_id=SESSION)
    memory.save_context({"input": SECRET_TURN}, {"output": "Blorptech confirmed"})
    memory.load_memory_variables({"input": "Zyxwvuta Qwertyson again"})
    memory.get_entity_info("Zyxwvuta Qwertyson")
    asyncio.run(memory.aload_memory_variables({"input": "Blorptech?"}))
    memory.set_retention(keep_last=1)
    memory.prune()
    memory.forget_entity("Blorptech")
    memory.clear()


def test_no_turn_text_entity_name_or_session_id_leaves_by_default(
    store: Store, recorded: Recorded, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="zerda_store"):
        run_everything(store)
    assert recorded.spans() and recorded.metrics()
    assert any(r.name == "zerda_store.operations" for r in caplog.records)
    text = every_recorded_text(recorded, caplog.records)
    for secret in [
        SECRET_TURN,
        *SECRET_NAMES,
        "Zyxwvuta",
        "Qwertyson",
        "99-1234",
        SESSION,
        "customer-4711",
    ]:
        assert secret not in text


def test_content_is_recorded_only_when_the_user_opts_in(database_url: str) -> None:
    recorded = Recorded(record_content=True)
    with Store(database_url, telemetry=recorded.telemetry) as store:
        run_everything(store)
    (recall, *_) = recorded.named("search_memory")
    attributes = dict(recall.attributes or {})
    assert attributes["gen_ai.memory.query.text"] == "Zyxwvuta Qwertyson again"
    assert "Zyxwvuta Qwertyson" in str(attributes["gen_ai.memory.records"])
    (save,) = recorded.named("update_memory")
    assert SECRET_TURN in str(dict(save.attributes or {})["gen_ai.memory.records"])


def test_without_a_provider_nothing_is_recorded_and_calls_work(sqlite_url: str) -> None:
    script = f"""
import sys
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store
from zerda_store.db.store import core_of
from zerda_store.telemetry import operations
seen = []
original = operations.Operation.__init__
def spy(self, *args, **kwargs):
    seen.append(args)
    original(self, *args, **kwargs)
operations.Operation.__init__ = spy
with Store({sqlite_url!r}) as store:
    memory = ConversationEntityMemory(llm=KeywordLLM(["Sarah"]), store=store, session_id="s")
    memory.save_context({{"input": "Sarah"}}, {{"output": "ok"}})
    assert "Sarah" in memory.load_memory_variables({{"input": "Sarah"}})["entity_info"]
    telemetry = core_of(store).telemetry
    assert telemetry.tracer() is None and telemetry.instruments() is None
assert seen == [], seen
print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"  # never imported


def test_a_global_tracer_provider_set_after_the_store_opened_is_used(sqlite_url: str) -> None:
    script = f"""
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tests.doubles import KeywordLLM
from zerda_store import ConversationEntityMemory, Store
with Store({sqlite_url!r}) as store:
    memory = ConversationEntityMemory(llm=KeywordLLM(["Sarah"]), store=store, session_id="s")
    memory.save_context({{"input": "Sarah"}}, {{"output": "ok"}})
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    memory.load_memory_variables({{"input": "Sarah"}})
print(sorted(span.name.split()[0] for span in exporter.get_finished_spans()))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['extract_entities', 'read', 'search_memory']"


def test_a_sync_llm_called_from_async_code_nests_its_own_span_under_the_extraction(
    store: Store, recorded: Recorded
) -> None:
    tracer = recorded.tracer_provider.get_tracer("llm-client")

    class TracedLLM(KeywordLLM):  # an instrumented LLM client, run on the store's LLM threads
        def generate(self, prompt: str, max_tokens: int = 256) -> str:
            with tracer.start_as_current_span("chat model"):
                return super().generate(prompt, max_tokens)

    memory = ConversationEntityMemory(llm=TracedLLM(NAMES), store=store, session_id=SESSION)
    asyncio.run(memory.aload_memory_variables({"input": "Sarah?"}))
    (model,) = recorded.named("chat model")
    (extraction,) = recorded.named("extract_entities")
    assert model.parent is not None and extraction.context is not None
    assert model.parent.span_id == extraction.context.span_id


def test_a_retried_unit_of_work_shows_its_attempts_and_each_retry(
    sqlite_url: str, recorded: Recorded, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unit_of_work, "backoff", lambda _number: 0.0)

    class Caller:
        def __init__(self, store: Store) -> None:
            self.store = core_of(store)

        @observed(UPDATE, "test_call")
        def call(self, work: Any) -> Any:
            return unit_of_work.write(self.store, work)

    runs: list[int] = []

    def work(transaction: Any) -> int:
        runs.append(1)
        if len(runs) == 1:
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")  # lost
        return 42

    with Store(sqlite_url, telemetry=recorded.telemetry) as store:
        assert Caller(store).call(work) == 42
    (unit,) = recorded.named("write")
    assert dict(unit.attributes or {})["zerda_store.unit_of_work.attempts"] == 2
    (retry,) = unit.events
    assert retry.name == "zerda_store.unit_of_work.retry"
    assert dict(retry.attributes or {})["error.type"] == "ProgrammingError"
    (retries,) = recorded.metrics()["zerda_store.unit_of_work.retries"]
    assert retries.value == 1


def test_a_unit_of_work_counts_its_statements_and_on_postgres_its_round_trips(
    store: Store, recorded: Recorded, database_url: str
) -> None:
    memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), store=store, session_id=SESSION)
    memory.save_context({"input": "Sarah works at Acme"}, {"output": "Noted."})
    memory.forget_entity("Acme")

    units = recorded.named("write") + recorded.named("read")
    assert units
    for unit in units:
        attributes = dict(unit.attributes or {})
        statements = attributes["zerda_store.unit_of_work.statements"]
        assert isinstance(statements, int) and statements >= 1
        if system(database_url) == "sqlite":
            assert "zerda_store.unit_of_work.round_trips" not in attributes
        else:  # at least one wait; at most one per statement, BEGIN and COMMIT
            assert 1 <= attributes["zerda_store.unit_of_work.round_trips"] <= statements + 2
    if system(database_url) == "postgresql":
        trips = recorded.metrics()["zerda_store.unit_of_work.round_trips"]
        assert sum(p.count for p in trips) >= 2
        assert sum(p.sum for p in trips) == sum(
            dict(u.attributes or {})["zerda_store.unit_of_work.round_trips"] for u in units
        )


@pytest.mark.postgres
def test_a_write_that_waits_for_its_sessions_advisory_lock_shows_the_wait(
    postgres_url: str, recorded: Recorded
) -> None:
    with Store(postgres_url, telemetry=recorded.telemetry) as store:
        memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), store=store, session_id=SESSION)
        memory.save_context({"input": "Sarah works at Acme"}, {"output": "Noted."})
        recorded.exporter.clear()
        holder = sa.create_engine(postgres_url.replace("postgresql://", "postgresql+psycopg://"))
        with holder.connect() as connection:
            connection.execute(
                sa.text("SELECT pg_advisory_xact_lock_shared(:key, hashtext(:session))"),
                {"key": unit_of_work.SESSION_LOCK_NAMESPACE, "session": SESSION},
            )  # a save of the session, still open: the forget's exclusive lock waits
            forgetting = threading.Thread(target=memory.forget_entity, args=("Acme",))
            forgetting.start()
            with holder.connect() as watcher:  # held from when the forget is seen waiting
                while not watcher.execute(WAITING_FOR_AN_ADVISORY_LOCK).scalar():
                    watcher.rollback()
                    time.sleep(0.01)
            time.sleep(0.3)
            connection.rollback()
        forgetting.join(timeout=10)
        holder.dispose()
    (forget,) = recorded.named("delete_memory")
    (unit,) = [c for c in children(recorded, forget) if c.name.startswith("write")]
    waited = dict(unit.attributes or {})["zerda_store.lock.wait.duration"]
    assert isinstance(waited, float) and 0.3 <= waited <= unit_seconds(unit)
    (lock_wait,) = recorded.metrics()["zerda_store.lock.wait.duration"]
    assert lock_wait.sum >= 0.3


WAITING_FOR_AN_ADVISORY_LOCK = sa.text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
)


def unit_seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


def test_with_child_spans_for_failures_only_a_turn_is_two_spans_with_the_figures_folded_in(
    database_url: str,
) -> None:
    recorded = Recorded(child_spans="failures")
    with Store(database_url, telemetry=recorded.telemetry) as store:
        memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), store=store, session_id=SESSION)
        memory.save_context({"input": "Sarah works at Acme"}, {"output": "Noted."})
        asyncio.run(memory.aload_memory_variables({"input": "What about Sarah?"}))
    assert sorted(span.name.split()[0] for span in recorded.spans()) == [
        "search_memory",
        "update_memory",
    ]
    for span in recorded.spans():
        attributes = dict(span.attributes or {})
        assert attributes["zerda_store.unit_of_work.count"] >= 1
        assert attributes["zerda_store.unit_of_work.statements"] >= 1
        assert attributes["zerda_store.extraction.duration"] >= 0
        if system(database_url) == "postgresql":
            assert attributes["zerda_store.unit_of_work.round_trips"] >= 1
    writes = [
        p
        for p in recorded.metrics()["db.client.operation.duration"]
        if dict(p.attributes)["db.operation.name"] == "write"
    ]
    assert sum(p.count for p in writes) == 1  # the units are measured all the same


def test_with_child_spans_for_failures_a_retried_unit_and_a_failed_extraction_get_spans(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(unit_of_work, "backoff", lambda _number: 0.0)
    recorded = Recorded(child_spans="failures")

    class Caller:
        def __init__(self, store: Store) -> None:
            self.store = core_of(store)

        @observed(UPDATE, "test_call")
        def call(self, work: Any) -> Any:
            return unit_of_work.write(self.store, work)

    runs: list[int] = []

    def work(transaction: Any) -> int:
        runs.append(1)
        if len(runs) == 1:
            raise sqlite3.ProgrammingError("Cannot operate on a closed database.")  # lost
        return 42

    with Store(sqlite_url, telemetry=recorded.telemetry) as store:
        assert Caller(store).call(work) == 42
        broken = ConversationEntityMemory(llm=BrokenLLM(), store=store, session_id=SESSION)
        broken.save_context({"input": "Sarah"}, {"output": "ok"})
    (call, save) = recorded.named("update_memory")
    (unit,) = recorded.named("write")
    assert unit.parent is not None and unit.parent.span_id == call.context.span_id
    assert dict(unit.attributes or {})["zerda_store.unit_of_work.attempts"] == 2
    (retry,) = unit.events
    assert retry.name == "zerda_store.unit_of_work.retry"
    assert unit.start_time <= retry.timestamp <= unit.end_time  # type: ignore[operator]
    assert call.start_time <= unit.start_time  # type: ignore[operator]
    (extraction,) = recorded.named("extract_entities")
    assert extraction.parent is not None and extraction.parent.span_id == save.context.span_id
    assert extraction.status.status_code is StatusCode.ERROR
    assert dict(extraction.attributes or {})["error.type"] == "RuntimeError"


def test_under_a_dropped_operation_no_child_span_is_even_started(store: Store) -> None:
    asked: list[str] = []

    class Dropping(Sampler):
        def should_sample(self, parent_context: Any, trace_id: int, name: str, *_: Any) -> Any:
            asked.append(name.split()[0])
            return SamplingResult(Decision.DROP)

        def get_description(self) -> str:
            return "drops every span"

    provider = TracerProvider(sampler=Dropping())
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    core_of(store).telemetry = Telemetry(tracer_provider=provider)
    memory = ConversationEntityMemory(llm=KeywordLLM(NAMES), store=store, session_id=SESSION)
    memory.save_context({"input": "Sarah works at Acme"}, {"output": "Noted."})
    asyncio.run(memory.aload_memory_variables({"input": "What about Sarah?"}))
    assert asked == ["update_memory", "search_memory"]
    assert exporter.get_finished_spans() == ()


def test_nothing_personal_leaves_with_child_spans_for_failures_only(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    recorded = Recorded(child_spans="failures")
    core_of(store).telemetry = recorded.telemetry
    with caplog.at_level(logging.DEBUG, logger="zerda_store"):
        run_everything(store)
    text = every_recorded_text(recorded, caplog.records)
    assert "zerda_store.unit_of_work.count" in text
    for secret in [SECRET_TURN, *SECRET_NAMES, "Zyxwvuta", "Qwertyson", "99-1234", SESSION]:
        assert secret not in text
