"""Turns: saving a chat turn's text, entities and snippets, and reading them back."""
