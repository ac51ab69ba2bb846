"""The async twin of :mod:`..conversation`'s calls (``asave_context`` and the rest), under the same stem."""
