"""Benchmarks of zerda_store against hand-written raw-driver floors and LangChain.

Run ``python -m benchmarks.bench_turns --help``. Nothing here is imported by the library.
"""
