"""What the memory reports of itself: OpenTelemetry spans and metrics (when the API is
installed and a provider configured) and log lines, without personal data unless asked.

See ``docs/observability.md``. Nothing here imports OpenTelemetry at import time.
"""

from __future__ import annotations

from .settings import CHILD_SPANS_ENV, CONTENT_ENV, Telemetry, default_telemetry

__all__ = ["CHILD_SPANS_ENV", "CONTENT_ENV", "Telemetry", "default_telemetry"]
