"""Entity extraction: the LLM path, the stanza path, and the service that runs either.

This module knows nothing about storage. An extractor returns names (and types where it
knows them) or raises; :class:`ExtractionService` turns every failure into a logged,
counted result so that a chat turn is never lost to an extraction error.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import operator
import re
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from .model.names import (
    MAX_NAME_LENGTH,
    MAX_TYPE_LENGTH,
    UNKNOWN_TYPE,
    cached_without_ignorables,
    is_acceptable_name,
)
from .model.names import without_ignorables as _without_ignorables
from .model.templates import filler
from .telemetry import extraction as observed_extraction
from .telemetry.operations import current as observed_operation

logger = logging.getLogger(__name__)

MODEL_RETRY_SECONDS = 60.0
MAX_ERROR_LENGTH = 2000
MAX_REMEMBERED_ERRORS = 100

# The original class's default prompt, verbatim (indentation included): users who tuned an
# LLM against it get the same prompt here.
DEFAULT_EXTRACTION_PROMPT = (
    "استخرج الكيانات المهمة من النص التالي.\n"
    "                الكيانات يمكن أن تكون: أسماء أشخاص، أماكن، منظمات، منتجات، أو مفاهيم مهمة.\n"
    "                النص:\n"
    "                {text}\n"
    "                الكيانات (قائمة مفصولة بفواصل فقط، بدون شرح):\n"
    "                extract the important entities from the above text.\n"
    "                the entities can be: names of people, places, organizations, products, or topics.\n"
    "                the text {text} the entitites (a list without explainer text)\n"
    "\n"
    "                "
)

Status = Literal["ok", "failed", "skipped"]


@dataclass(frozen=True)
class ExtractedEntity:
    """One entity mention: the name as extracted and its type ("unknown" if not known)."""

    name: str
    entity_type: str = UNKNOWN_TYPE


@dataclass(frozen=True)
class ExtractionResult:
    """How one extraction went; ``entities`` is empty unless ``status == "ok"``."""

    entities: tuple[ExtractedEntity, ...]
    extractor: str
    status: Status
    error: str | None = None
    latency: float = 0.0

    @property
    def names(self) -> list[str]:
        return [entity.name for entity in self.entities]


@runtime_checkable
class Extractor(Protocol):
    """Anything that finds entities in text. It may raise; the service catches."""

    name: str

    def extract(self, text: str) -> Sequence[ExtractedEntity | str | tuple[str, str]]: ...


class LLMExtractor:
    """The original's LLM path: format the prompt, ask for 100 tokens, split on commas."""

    name = "llm"

    def __init__(self, llm: Any, prompt: str = DEFAULT_EXTRACTION_PROMPT) -> None:
        self.llm = llm
        self.prompt = prompt

    def extract(self, text: str) -> list[ExtractedEntity]:
        response = self.llm.generate(filler(self.prompt)(text), max_tokens=100)
        return _entities_in(response, "generate")

    @property
    def is_async(self) -> bool:
        """True when the LLM has ``agenerate``: async callers await it on the event loop."""
        return callable(getattr(self.llm, "agenerate", None))

    async def aextract(self, text: str) -> list[ExtractedEntity]:
        """:meth:`extract` through ``llm.agenerate(prompt, max_tokens=100)``."""
        response = self.llm.agenerate(filler(self.prompt)(text), max_tokens=100)
        if inspect.isawaitable(response):
            response = await response
        return _entities_in(response, "agenerate")


def _entities_in(response: object, method: str) -> list[ExtractedEntity]:
    """The original's parsing: split on commas (and "،"), strip, drop fragments of 2 or less."""
    if not isinstance(response, str):
        raise TypeError(f"llm.{method} returned {type(response).__name__}, expected str")
    parts = response.replace("،", ",").split(",")
    if len(response) > 4 * MAX_NAME_LENGTH:  # past what 100 tokens make: checked, not cached
        return [ExtractedEntity(p) for p in map(_without_ignorables, parts) if len(p) > 2]
    return _Parsed([_parsed_entity(p) for p in map(cached_without_ignorables, parts) if len(p) > 2])


class _Parsed(list):  # type: ignore[type-arg]
    """Entities parsed here from a model's usual answer: names are short ``str``, types
    unknown, so :func:`_coerce` passes them on unchecked."""


# An entity is immutable, and a CRM's assistant meets the same names (short ones) again.
_parsed_entity = functools.lru_cache(maxsize=16384)(ExtractedEntity)


async def aextract(extractor: Extractor, text: str, executor: Executor | None) -> Any:
    """``extractor.extract(text)`` from async code: its ``aextract`` (or a coroutine
    ``extract``) awaited on the event loop; a synchronous one on ``executor``'s threads,
    never on the loop."""
    awaitable = getattr(extractor, "aextract", None)
    if awaitable is not None and getattr(extractor, "is_async", True):
        return await awaitable(text)
    if inspect.iscoroutinefunction(extractor.extract):
        return await extractor.extract(text)
    loop = asyncio.get_running_loop()
    # The caller's context (its span) goes with the call to the thread, so that an
    # instrumented LLM client's span nests under the extraction's.
    call = observed_extraction.carried(extractor.extract)
    return await loop.run_in_executor(executor, call, text)


class StanzaExtractor:
    """stanza NER, built lazily once under a lock; offline unless ``download=True``.

    ``stanza_dir`` (or ``STANZA_RESOURCES_DIR``) points at a resources folder. With
    ``download=False`` stanza is told never to fetch anything, so a missing model is a
    fast ``FileNotFoundError`` instead of a network wait.
    """

    name = "stanza"

    def __init__(
        self, lang: str = "en", *, stanza_dir: str | None = None, download: bool = False
    ) -> None:
        self.lang = lang
        self.stanza_dir = stanza_dir
        self.download = download
        self._pipeline: Any = None
        self._missing: tuple[float, str] | None = None  # when and why loading last failed
        self._lock = threading.Lock()

    @classmethod
    def shared(
        cls, lang: str = "en", *, stanza_dir: str | None = None, download: bool = False
    ) -> StanzaExtractor:
        """One extractor (so one loaded pipeline) per process for these settings, however
        many memories use it: a pipeline takes seconds and hundreds of MB to load."""
        key = (lang, stanza_dir, download)
        with _SHARED_LOCK:
            if key not in _SHARED:
                _SHARED[key] = cls(lang, stanza_dir=stanza_dir, download=download)
            return _SHARED[key]

    def pipeline_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"lang": self.lang, "processors": "tokenize,ner"}
        if not self.download:
            options["download_method"] = None
        if self.stanza_dir:
            options["dir"] = self.stanza_dir
        return options

    def _build(self) -> Any:
        import stanza  # optional dependency: only the stanza path needs it

        try:
            return stanza.Pipeline(**self.pipeline_options())
        except (FileNotFoundError, ValueError) as exc:
            reason = (
                f"stanza model for lang={self.lang!r} is not available ({exc}); "
                f"install it with `zerda-store models download {self.lang}` "
                "or pass stanza_dir= to a resources folder"
            )
            self._missing = (time.monotonic(), reason)
            raise ModelNotAvailableError(reason) from exc

    def extract(self, text: str) -> list[ExtractedEntity]:
        with self._lock:
            if self._pipeline is None:
                # A missing model is looked for again only now and then, not on every
                # turn: stanza logs its own error at each attempt.
                if self._missing and time.monotonic() - self._missing[0] < MODEL_RETRY_SECONDS:
                    raise ModelNotAvailableError(self._missing[1])
                self._pipeline = self._build()
            doc = self._pipeline(text)
        found = []
        for ent in doc.ents:
            name = ent.text.strip()
            if name.isalpha() or len(name) > 3:
                found.append(ExtractedEntity(name, getattr(ent, "type", None) or UNKNOWN_TYPE))
        return found


_SHARED: dict[tuple[str, str | None, bool], StanzaExtractor] = {}
_SHARED_LOCK = threading.Lock()


class ModelNotAvailableError(RuntimeError):
    """The stanza model for the requested language is not installed."""


# Control characters other than newline and tab, and lone surrogates.
_UNSTORABLE_IN_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _storable(text: str, limit: int = MAX_TYPE_LENGTH) -> str:
    """Text that every backend can store: control characters other than newlines and
    tabs, and lone surrogates, are escaped; at most ``limit`` characters."""
    escaped = _UNSTORABLE_IN_TEXT.sub(
        lambda found: found.group().encode("unicode_escape").decode("ascii"), text
    )
    return escaped[:limit]


# An extractor's name as the ledger stores it (extractors are few; names repeat).
_label = functools.lru_cache(maxsize=64)(_storable)
_acceptable_name = functools.lru_cache(maxsize=16384)(is_acceptable_name)  # for short names
_NAME = operator.attrgetter("name")


def _coerce(items: Iterable[ExtractedEntity | str | tuple[str, str]]) -> list[ExtractedEntity]:
    """Entities from what an extractor returned; types are clipped to what the table holds."""
    if type(items) is _Parsed:
        return items
    entities = []
    for item in items:
        if type(item) is not ExtractedEntity:  # the LLM path's entities pass straight on
            if isinstance(item, str):
                item = ExtractedEntity(item)
            elif not isinstance(item, ExtractedEntity):
                name, entity_type = item
                item = ExtractedEntity(name, entity_type or UNKNOWN_TYPE)
        if not isinstance(item.name, str) or not isinstance(item.entity_type, str):
            raise TypeError(f"an extractor returned {item!r}: names and types must be str")
        if (
            len(item.name) <= MAX_NAME_LENGTH
            and (cleaned := cached_without_ignorables(item.name)) != item.name
        ):
            item = ExtractedEntity(cleaned, item.entity_type)
        if item.entity_type != UNKNOWN_TYPE:
            entity_type = item.entity_type[:MAX_TYPE_LENGTH]
            if not is_acceptable_name(entity_type):
                entity_type = UNKNOWN_TYPE
            if entity_type != item.entity_type:
                item = ExtractedEntity(item.name, entity_type)
        entities.append(item)
    return entities


class ExtractionService:
    """Runs an extractor; never raises. Counts failures and drops names that cannot be stored."""

    def __init__(self, extractor: Extractor | None = None) -> None:
        self.extractor = extractor
        self.error_count = 0
        self.last_error: str | None = None
        self._logged_errors: set[str] = set()
        self._lock = threading.Lock()

    def extract(self, text: str, extractor: Extractor | None = None) -> ExtractionResult:
        """Entities in ``text`` by ``extractor`` (else the service's own); blank text is
        skipped without calling any model."""
        extractor, name = self._named(extractor)
        if not text.strip():
            return ExtractionResult((), name, "skipped")
        if observed_operation.get() is not None and observed_extraction.outside():
            return observed_extraction.observed(name, self.extract, text, extractor)  # spanned
        started = time.perf_counter()
        try:
            found = extractor.extract(text)
        except Exception as exc:  # extraction must never break a chat turn
            return self._failed(name, exc, started)
        return self._result(name, found, started)

    async def aextract(
        self, text: str, extractor: Extractor | None = None, executor: Executor | None = None
    ) -> ExtractionResult:
        """:meth:`extract` from async code (:func:`aextract`): an async LLM or
        extractor is awaited, a synchronous one runs on ``executor``. Cancellation goes
        through; every other failure is a failed result, as in :meth:`extract`."""
        extractor, name = self._named(extractor)
        if not text.strip():
            return ExtractionResult((), name, "skipped")
        return await observed_extraction.aobserved(
            name, self._aextract, text, extractor, executor, name
        )

    async def _aextract(
        self, text: str, extractor: Extractor, executor: Executor | None, name: str
    ) -> ExtractionResult:
        started = time.perf_counter()
        try:
            found = await aextract(extractor, text, executor)
        except Exception as exc:  # extraction must never break a chat turn
            return self._failed(name, exc, started)
        return self._result(name, found, started)

    def _named(self, extractor: Extractor | None) -> tuple[Extractor, str]:
        extractor = extractor or self.extractor
        if extractor is None:
            raise ValueError("no extractor given")
        return extractor, _label(str(getattr(extractor, "name", type(extractor).__name__)))

    def _result(self, name: str, found: Any, started: float) -> ExtractionResult:
        try:
            entities = _coerce(found)
        except Exception as exc:
            return self._failed(name, exc, started)
        if (
            type(entities) is _Parsed  # short names
            or max(map(len, map(_NAME, entities)), default=0) <= MAX_NAME_LENGTH
        ) and all(map(_acceptable_name, map(_NAME, entities))):
            kept = tuple(entities)
        else:
            kept = tuple(filter(self._acceptable, entities))
        return ExtractionResult(kept, name, "ok", None, time.perf_counter() - started)

    def _failed(self, name: str, exc: Exception, started: float) -> ExtractionResult:
        error = _storable(f"{type(exc).__name__}: {exc}", MAX_ERROR_LENGTH)
        self._record_failure(error)
        return ExtractionResult((), name, "failed", error, time.perf_counter() - started)

    def _record_failure(self, error: str) -> None:
        with self._lock:
            self.error_count += 1
            self.last_error = error
            first_time = error not in self._logged_errors
            if len(self._logged_errors) >= MAX_REMEMBERED_ERRORS:
                self._logged_errors.clear()  # errors that carry request ids never repeat
            self._logged_errors.add(error)
        if first_time:
            logger.error("Error in extracting entities: %s", error)
        else:
            logger.debug("Error in extracting entities (again): %s", error)

    @staticmethod
    def _acceptable(entity: ExtractedEntity) -> bool:
        if len(entity.name) <= MAX_NAME_LENGTH and _acceptable_name(entity.name):
            return True
        logger.warning(
            "skipped an entity name of %d characters: too long or holds control characters",
            len(entity.name),
        )
        return False
