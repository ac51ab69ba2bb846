"""The labelled evaluation: how often two mentions of one entity join, and that two
entities never do. ``benchmarks/identity.py`` prints the same figures per phenomenon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.identity import evaluate, merged, total
from zerda_store.identity.rules import identify
from zerda_store.model.names import FOLD_V2, FOLD_V2_CASELESS

DATA = Path(__file__).resolve().parent.parent / "data"
PAIRS = json.loads((DATA / "identity-pairs.json").read_text(encoding="utf-8"))["pairs"]
SAMPLE = json.loads((DATA / "identity-sample.json").read_text(encoding="utf-8"))["pairs"]


def test_the_labelled_set_is_large_enough_and_in_both_languages():
    differing = [pair for pair in PAIRS if pair["a"] != pair["b"]]
    arabic = [p for p in differing if any("\u0600" <= ch <= "\u06ff" for ch in p["a"] + p["b"])]
    assert len(differing) >= 300
    assert len(arabic) >= 100


@pytest.mark.parametrize("pairs", [PAIRS, PAIRS + SAMPLE], ids=["own", "with the sample"])
def test_merges_are_precise_and_find_most_variants(pairs):
    whole = total(evaluate(pairs, FOLD_V2))
    assert whole.precision >= 0.97, whole.precision
    assert whole.recall >= 0.70, whole.recall


def test_no_hard_negative_merges():
    negatives = [p for p in PAIRS + SAMPLE if p["phenomenon"] == "hard_negatives"]
    assert len(negatives) >= 80
    joined = [p["id"] for p in negatives if p["a"] != p["b"] and merged(p["a"], p["b"], FOLD_V2)]
    assert joined == []


@pytest.mark.parametrize(
    ("a", "b"),
    [("US", "us"), ("WHO", "who"), ("Bill", "bill"), ("Apple", "apple"), ("U.S.", "us")],
)
def test_an_ordinary_word_in_lower_case_keeps_apart(a, b):
    assert FOLD_V2.key(a) != FOLD_V2.key(b)
    assert FOLD_V2_CASELESS.key(a) == FOLD_V2_CASELESS.key(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Sarah", "sarah"),
        ("dubai", "Dubai"),
        ("Acme Corp.", "Acme Corp"),
        ("مدرسة", "مدرسه"),
        ("مصطفى", "مصطفي"),
        ("Galaxy S24", "Galaxy S٢٤"),
        ("Acme Corp\u200e", "Acme Corp"),
        ("Zoë Adams", "Zoe Adams"),
        ("J. P. Morgan", "JP Morgan"),
        ("عبد الله", "عبدالله"),
    ],
)
def test_spelling_variants_share_a_key(a, b):
    assert FOLD_V2.key(a) == FOLD_V2.key(b)


@pytest.mark.parametrize(
    ("a", "b"),
    [("Version 3.5", "Version 35"), ("C#", "C"), ("عمر", "عمرو"), ("سعيد", "سعيدة")],
)
def test_names_that_differ_keep_their_keys_apart(a, b):
    assert FOLD_V2.key(a) != FOLD_V2.key(b)


def test_titles_and_legal_forms_are_markers_not_part_of_the_core():
    assert identify("Dr. Sarah Chen PhD", FOLD_V2).core == "sarah chen"
    assert identify("Acme Inc.", FOLD_V2).core == identify("Acme Incorporated", FOLD_V2).core
    assert FOLD_V2.key("Dr. Sarah Chen") != FOLD_V2.key("Sarah Chen")
