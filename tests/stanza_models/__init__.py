"""Tiny stanza models for the tests: synthetic data, training, resources layout."""
