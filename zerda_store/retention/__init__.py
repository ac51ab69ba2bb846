"""Retention: the policies, what they let reads show, and pruning what they expired."""
