"""The ``zerda-store`` command line (``zerda_store.cli:main``)."""

from __future__ import annotations

from .main import main

__all__ = ["main"]
