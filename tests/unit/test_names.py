from __future__ import annotations

import pytest

from tests.doubles import FixedLLM
from zerda_store.extraction import LLMExtractor
from zerda_store.model.names import is_acceptable_name, name_key


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("Sarah", "sarah"),
        ("Sarah  Connor", " sarah connor "),
        ("STRASSE", "straße"),
        ("ﬁnance", "finance"),  # NFKC ligature
        ("أحمد", "احمد"),
        ("إيمان", "ايمان"),
        ("آمنة", "امنة"),
        ("مُحَمَّد", "محمد"),
        ("محـــمد", "محمد"),
    ],
)
def test_spellings_of_one_name_share_a_key(a, b):
    assert name_key(a) == name_key(b)


def test_different_names_keep_different_keys():
    assert name_key("Sarah") != name_key("Sara")
    assert name_key("محمد") != name_key("محمود")


def test_without_normalization_the_name_is_its_own_key():
    assert name_key("Sarah ", normalize=False) == "Sarah "
    assert name_key("Sarah", normalize=False) != name_key("sarah", normalize=False)


def test_names_over_256_code_points_or_with_control_characters_are_refused():
    assert is_acceptable_name("x" * 256)
    assert not is_acceptable_name("x" * 257)
    assert is_acceptable_name("😀" * 256)  # code points, not bytes
    assert not is_acceptable_name("Sa\x00rah")
    assert not is_acceptable_name("Sa\nrah")
    assert not is_acceptable_name("")


def test_the_llm_answer_is_split_on_the_arabic_comma_too():
    extractor = LLMExtractor(FixedLLM("أحمد، شركة النور, Acme"))

    names = [entity.name for entity in extractor.extract("any text")]
    assert names == ["أحمد", "شركة النور", "Acme"]
