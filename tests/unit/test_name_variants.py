"""Suggestions of name variants: attested transliterations, nicknames and acronyms are
suggested with a reason and a score, never merged by the key rules; confusable names are
rarely suggested; the pairing's work grows with the number of names; the held-out pairs
meet their targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.identity import evaluate_variants, merged
from zerda_store.identity import variants
from zerda_store.identity.similar import Pairing, similar_pairs
from zerda_store.model.names import FOLD_V2

PAIRS = Path(__file__).resolve().parent.parent / "data/identity-variant-pairs.json"


def reason_of(a: str, b: str) -> tuple[str, float] | None:
    found = similar_pairs([a, b], FOLD_V2)
    return (found[0].reason, found[0].score) if found else None


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Mustafa", "Moustafa"),  # Latin and Latin through one Arabic name
        ("Hamza", "Hamzah"),
        ("Muhammad Al Qahtani", "Mohammed Al Qahtani"),
        ("Jamila Haddad", "جميلة حداد"),  # Arabic script and Latin
        ("Dammam", "الدمام"),  # a place
    ],
)
def test_an_attested_transliteration_is_suggested_never_merged(a, b):
    reason, score = reason_of(a, b) or ("none", 0.0)
    assert reason == "transliteration"
    assert 0.5 <= score <= 0.9
    assert not merged(a, b, FOLD_V2)


@pytest.mark.parametrize(
    ("a", "b"),
    [("Peggy Ross", "Margaret Ross"), ("Dick Hale", "Richard Hale"), ("Bill", "William")],
)
def test_a_nickname_with_the_same_surname_is_suggested_never_merged(a, b):
    assert reason_of(a, b) is not None
    assert reason_of(a, b)[0] == "nickname"  # type: ignore[index]
    assert not merged(a, b, FOLD_V2)


def test_a_nickname_with_another_surname_is_not_suggested():
    assert reason_of("Robert Smith", "Bob Jones") is None


def test_a_nickname_and_a_full_name_score_above_a_first_name_alone():
    with_surname = reason_of("Peggy Ross", "Margaret Ross")
    alone = reason_of("Peggy", "Margaret")
    assert with_surname is not None and alone is not None
    assert with_surname[1] > alone[1]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("HSBC", "Hongkong and Shanghai Banking Corporation"),
        ("ENBD", "Emirates NBD"),
        ("P&G", "Procter & Gamble"),
        ("ADNOC", "Abu Dhabi National Oil Company"),
    ],
)
def test_an_acronym_of_a_name_of_several_words_is_suggested(a, b):
    assert reason_of(a, b) == ("acronym", 0.7)
    assert not merged(a, b, FOLD_V2)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Samir", "Samira"),
        ("Hani", "Hana"),
        ("Hamad", "Hamed"),
        ("Omar", "Amr"),
        ("Alexander Grant", "Alexandra Grant"),
        ("CIB", "CIBC"),
        ("Michael", "Michelle"),
    ],
)
def test_names_the_data_knows_as_different_are_not_suggested(a, b):
    assert reason_of(a, b) is None


def test_a_rejected_pair_is_never_listed():
    names = ["Mustafa", "Moustafa", "Peggy Ross", "Margaret Ross"]
    rejected = {("moustafa", "mustafa")}
    listed = [(p.a, p.b) for p in similar_pairs(names, FOLD_V2, rejected=rejected)]
    assert listed == [("Peggy Ross", "Margaret Ross")]


def test_pairs_come_by_score():
    names = ["Acme Corp", "Peggy", "Acme", "Margaret", "Mustafa", "Moustafa"]
    scores = [p.score for p in similar_pairs(names, FOLD_V2)]
    assert scores == sorted(scores, reverse=True)
    assert len(scores) == 3


def test_another_languages_variants_are_a_data_file():
    data = variants.VariantData()
    variants.load(data, "spellings.el.tsv", "Νίκος\tNikos\tNicos\t0.8\n# a comment\n")
    variants.load(data, "nicknames.de.tsv", "Johannes\tHannes\n")
    assert data.spellings["nicos"] == {"νικοσ": 0.8}  # folded: final sigma as σ
    assert data.spellings["nikos"] == {"νικοσ": 1.0}
    assert data.nicknames["hannes"] == {"johannes"}


def _session(count: int) -> list[str]:
    """``count`` names that each block under several variant keys: Arabic given names
    in Latin spellings, nicknames with shared surnames, acronyms and company names."""
    given = ["Mohammed", "Muhammad", "Mohamed", "Yusuf", "Youssef", "Peggy", "Margaret",
             "Bill", "William", "Hamza", "Hamzah", "Fatima", "Fatma"]  # fmt: skip
    names = []
    for i in range(count):
        if i % 5 == 4:
            names.append(f"{'ABCDEFGH'[i % 8]}{'KLMNOPQR'[i // 8 % 8]}{'STUV'[i // 64 % 4]}")
        else:
            names.append(f"{given[i % len(given)]} Haddad{i // 40}")
    return names


def test_the_pairing_of_10000_names_grows_with_their_number_not_its_square():
    counts = {}
    for count in (5_000, 10_000):
        pairing = Pairing()
        similar_pairs(_session(count), FOLD_V2, pairing=pairing)
        counts[count] = pairing.candidates
    # every name is proposed with a bounded number of others, whatever the count ...
    assert counts[10_000] <= 10_000 * 40, counts
    # ... so twice the names cost about twice the candidates (a square would be 4 times)
    assert counts[10_000] <= 2.5 * counts[5_000], counts


def test_the_held_out_pairs_meet_the_targets():
    pairs = [p for p in json.loads(PAIRS.read_text())["pairs"] if p["split"] == "held-out"]
    found = evaluate_variants(pairs)
    for phenomenon in ("transliteration", "nickname"):
        tally = found["held-out", phenomenon]
        assert tally.found / tally.pairs >= 0.85, (phenomenon, tally.lines)
    confusable = found["held-out", "confusable"]
    assert confusable.merged == 0
    assert confusable.suggested / confusable.pairs <= 0.25, confusable.lines
