"""Figures, the machine they were measured on, and their markdown and JSON forms."""

from __future__ import annotations

import datetime as dt
import os
import platform
import sqlite3
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = (
    "SQLAlchemy",
    "alembic",
    "psycopg",
    "langchain-classic",
    "langchain-community",
    "langchain-core",
)


@dataclass
class Figure:
    """One line of the table: zerda_store's figure, what it is compared with, the ratio
    the target is about, and whether the target was met."""

    section: str
    backend: str
    what: str
    unit: str
    value: float
    reference: float | None = None
    reference_name: str = ""
    ratio: float | None = None
    target: str = ""
    met: bool | None = None
    best: float | None = None
    reference_best: float | None = None
    note: str = ""
    # True when the ratio is reference/value (a speed-up, or a throughput in turns/s).
    inverse: bool = False

    @property
    def best_ratio(self) -> float | None:
        """The ratio of the best rounds, a second view on a noisy machine."""
        if not self.best or not self.reference_best:
            return None
        if self.inverse:
            return self.reference_best / self.best
        return self.best / self.reference_best


def ratio_figure(
    section: str,
    backend: str,
    what: str,
    value: Any,
    reference: Any,
    reference_name: str,
    *,
    limit: float | None = None,
    unit: str = "µs",
    note: str = "",
) -> Figure:
    """A figure whose ratio is value/reference (medians); ``limit`` is the most it may be."""
    ratio = value.median / reference.median
    return Figure(
        section,
        backend,
        what,
        unit,
        value.median,
        reference.median,
        reference_name,
        ratio,
        f"≤ {limit:g}×" if limit is not None else "",
        ratio <= limit if limit is not None else None,
        value.best,
        reference.best,
        note,
    )


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    if unit == "µs":
        return f"{value * 1e6:,.0f} µs" if value >= 1e-4 else f"{value * 1e6:,.1f} µs"
    if unit == "ms":
        return f"{value * 1e3:,.2f} ms"
    if unit == "MB":
        return f"{value:,.1f} MB"
    if unit == "turns/s":
        return f"{value:,.0f} turns/s"
    return f"{value:,.3g} {unit}"


def _cell(value: float | None, best: float | None, unit: str) -> str:
    text = _fmt(value, unit)
    if best is not None and value is not None and best != value:
        text += f" (best {_fmt(best, unit)})"
    return text


def markdown(figures: list[Figure], machine: dict[str, Any]) -> str:
    lines = [
        f"# zerda_store turn benchmark — {machine['date']}",
        "",
        "| machine | |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in machine.items() if key != "date"),
        "",
        "Medians over interleaved rounds (best round in brackets); ratios are of medians, "
        "with the ratio of the best rounds in brackets.",
        "",
        "| § | backend | what | zerda_store | compared with | ratio | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for figure in figures:
        reference = (
            f"{figure.reference_name}: {_cell(figure.reference, figure.reference_best, figure.unit)}"
            if figure.reference is not None
            else figure.reference_name or "—"
        )
        ratio = f"{figure.ratio:.2f}×" if figure.ratio is not None else "—"
        if figure.best_ratio is not None and figure.unit != "MB":
            ratio += f" (best {figure.best_ratio:.2f}×)"
        met = {True: "yes", False: "**no**", None: ""}[figure.met]
        what = figure.what + (f" — {figure.note}" if figure.note else "")
        lines.append(
            f"| {figure.section} | {figure.backend} | {what} | "
            f"{_cell(figure.value, figure.best, figure.unit)} | {reference} | {ratio} | "
            f"{figure.target} | {met} |"
        )
    return "\n".join(lines) + "\n"


def as_json(figures: list[Figure], machine: dict[str, Any]) -> dict[str, Any]:
    return {
        "machine": machine,
        "figures": [asdict(figure) | {"best_ratio": figure.best_ratio} for figure in figures],
    }


@dataclass
class Machine:
    """What the figures depend on besides the code."""

    info: dict[str, Any] = field(default_factory=dict)

    def collect(self, folder: str | None, postgres_version: str | None) -> dict[str, Any]:
        info = self.info
        info["date"] = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        info["cpu"] = f"{_cpu_model()} × {os.cpu_count()} cores"
        info["load average at start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        info["os"] = platform.platform()
        info["python"] = platform.python_version()
        info["sqlite"] = sqlite3.sqlite_version
        info["postgres"] = postgres_version or "not measured"
        info["packages"] = ", ".join(f"{name} {_version(name)}" for name in PACKAGES)
        info["fsync of the temp folder (p50)"] = f"{fsync_latency(folder) * 1e6:,.0f} µs"
        info["zerda_store commit"] = _git_commit()
        return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def _git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "zerda_store", "migrations"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + (" + uncommitted changes" if dirty else "")


def fsync_latency(folder: str | None, count: int = 30) -> float:
    """The median time of a 4 KiB write plus fsync: what a durable commit waits for."""
    times = []
    with tempfile.NamedTemporaryFile(dir=folder) as handle:
        for _ in range(count):
            started = time.perf_counter()
            handle.write(b"\0" * 4096)
            handle.flush()
            os.fsync(handle.fileno())
            times.append(time.perf_counter() - started)
    return statistics.median(times)
