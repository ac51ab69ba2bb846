"""Likely duplicates: best pairs first, a limit, names that differ in digits are not
misspellings, and the work grows with the number of names, not its square."""

from __future__ import annotations

import pytest

from zerda_store.identity import similar
from zerda_store.identity.similar import similar_pairs
from zerda_store.model.names import FOLD_V2, held_apart_key

NAMES = ["Sarah", "Acme Corp", "Sarah Chen", "Acme's", "Acme", "Jonathan", "Jonathon"]


def test_pairs_come_best_first_and_a_limit_keeps_the_first():
    pairs = [(p.a, p.b, p.reason) for p in similar_pairs(NAMES, FOLD_V2)]
    assert pairs == [
        ("Acme Corp", "Acme", "title or legal suffix"),
        ("Acme's", "Acme", "possessive"),
        ("Jonathan", "Jonathon", "spelling"),
        ("Sarah", "Sarah Chen", "first name"),
    ]
    assert [(p.a, p.b) for p in similar_pairs(NAMES, FOLD_V2, limit=2)] == [
        (a, b) for a, b, _ in pairs[:2]
    ]


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Client Account 1012", "Client Account 1013"),
        ("Ford F-150", "Ford F-250"),
        ("Unit 12A", "Unit 12B"),
    ],
)
def test_names_that_differ_in_digits_or_next_to_them_are_not_misspellings(a, b):
    reasons = {p.reason for p in similar_pairs([a, b], FOLD_V2)}
    assert "spelling" not in reasons


def test_a_misspelling_of_a_long_name_two_edits_apart_is_found():
    names = ["Pemberton Logistics", "Pembertn Logistic", "Fatima Haddad"]
    assert [(p.a, p.b, p.reason) for p in similar_pairs(names, FOLD_V2)] == [
        ("Pemberton Logistics", "Pembertn Logistic", "spelling")
    ]


def _look_alikes(count: int) -> list[str]:
    """Names that all look alike: one block under every rule that sorts them."""
    return [
        f"Customer {'abcdefghij'[i % 10]}{'klmnopqrst'[i // 10 % 10]}x Holdings {i}"
        for i in range(count)
    ]


def test_the_work_on_look_alike_names_grows_linearly(monkeypatch):
    calls = {"within": 0}
    measure = similar._within

    def counted(a: str, b: str, limit: int) -> bool:
        calls["within"] += 1
        return measure(a, b, limit)

    monkeypatch.setattr(similar, "_within", counted)
    for count in (500, 5000):
        calls["within"] = 0
        pairs = similar_pairs(_look_alikes(count), FOLD_V2)
        # at most a bounded number of measurements and pairs per name, whatever the count
        per_name = 2 * similar.NEIGHBOURS + similar.WINDOW
        assert calls["within"] <= count * per_name, (count, calls)
        assert len(pairs) <= count * (per_name + len(similar.RULES) * similar.WINDOW)


def test_stored_cores_pair_titled_forms_and_a_core_held_apart_is_computed_again():
    names = ["Dr Sarah Chen", "Sarah Chen", "Acme Corp", "Acme"]
    cores = [similar.identify(name, FOLD_V2).core for name in names]
    held = [cores[0], held_apart_key(7), cores[2], cores[3]]

    expected = similar_pairs(names, FOLD_V2)

    assert similar_pairs(names, FOLD_V2, cores=cores) == expected
    assert similar_pairs(names, FOLD_V2, cores=held) == expected
    assert ("Dr Sarah Chen", "Sarah Chen", "title or legal suffix") in [
        (pair.a, pair.b, pair.reason) for pair in expected
    ]
