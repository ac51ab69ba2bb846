"""Async calls: the twins of :mod:`..execution` and :mod:`..store` (same stems), the store's database threads, and the reads and writes sent from the event loop."""
