"""Seeded synthetic training data for the tiny stanza test models.

Sentences come from templates with entity slots filled from small name lists. The dev set
uses names that training never shows, and each language keeps further names out of both
(``held_out``) so that a build can report how the model does on names it never saw. ``PROBES`` are the sentences the tests feed to the models; a
build checks them before it lays out a resources folder.

Files written by :func:`write_corpus` (stanza's training formats):

- ``ner/{train,dev}.json``: a list of sentences, each a list of ``{"text", "ner"}`` (BIOES);
- ``tok/{train,dev}.txt`` and ``.labels``: one paragraph a line, a blank line between
  paragraphs; one label digit per character (0 inside a token or a space, 1 token end,
  2 sentence end); ``tok/mwt.json`` holds ``[]`` (no multi-word tokens);
- ``vectors.txt``: a header ``N DIM``, then one word and DIM random values a line, for the
  lowercased training vocabulary.

Only the standard library is used, so tests can import the probes without stanza.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

# Punctuation tokens written without a space before them.
ATTACHED = frozenset({".", ",", "?", "!", ":", "،", "؟"})
VECTOR_DIM = 32

Token = tuple[str, str, bool]  # (text, BIOES tag, space after)


@dataclass(frozen=True)
class Probe:
    """A sentence and the (name, type) pairs a model built from this data must find."""

    text: str
    entities: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class LanguageData:
    """Names and templates of one language. Training names are combinations of parts;
    ``dev`` names appear only in the dev set (so early stopping rewards names the model has
    not seen) and ``held_out`` names only in :func:`held_out_probes`."""

    code: str
    lang_name: str
    person: str  # the person slot's label
    org: str
    place: str
    first_names: tuple[str, ...]
    last_names: tuple[str, ...]
    org_heads: tuple[str, ...]
    org_tails: tuple[str, ...]
    org_head_alone: float  # how often an ORG is its head alone ("Globex")
    places: tuple[str, ...]
    dev: dict[str, tuple[str, ...]]
    held_out: dict[str, tuple[str, ...]]
    templates: tuple[str, ...]  # space-separated tokens; {SLOT} is one entity


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def _items(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(";"))


ENGLISH = LanguageData(
    code="en",
    lang_name="English",
    person="PERSON",
    org="ORG",
    place="GPE",
    first_names=_words(
        "Sarah John Maria David Emma James Olivia Michael Sophia Daniel Laura Peter Anna "
        "Thomas Grace Lucas Nina Omar Priya Kenji Elena Marco Fatima Liam Chloe Victor "
        "Hannah Samuel Julia Ethan Amir Yuki Carlos Leila Pavel Aisha Hugo Mei Jonas Rosa"
    ),
    last_names=_words(
        "Connor Smith Garcia Miller Johnson Brown Tanaka Rossi Novak Khan Dubois Schmidt "
        "Silva Kowalski Nguyen Haddad Walker Turner Fischer Moreau Patel Lopez Evans Wright "
        "Okafor Ivanova Mendes Lindqvist Sato Costa Weber Kim Ali Romero"
    ),
    org_heads=_items(
        "Acme; Globex; Initech; Umbrella; Stark; Wayne; Northwind; Contoso; Blue Harbor; "
        "Vandelay; Cyberdyne; Hooli; Tyrell; Massive Dynamic; Aperture; Gringotts; Summit; "
        "Evergreen; Pinnacle; Silver Lake; Redwood; Atlas; Nova; Horizon; Sterling; Oxford"
    ),
    org_tails=_words("Corp Inc Labs Group Bank Industries Systems University Health Foundation"),
    org_head_alone=0.3,
    places=_items(
        "Paris; London; Berlin; Tokyo; Cairo; Dubai; New York; Toronto; Madrid; Rome; Lisbon; "
        "Sydney; Mumbai; Nairobi; Chicago; Seoul; Vienna; Prague; Lima; Boston; Hanoi; "
        "Buenos Aires; San Francisco; Istanbul; France; Japan; Canada; Egypt; Brazil; "
        "Germany; Italy; Kenya; Mexico; Spain; India; Norway; Peru; Vietnam"
    ),
    dev={
        "PERSON": _items("Chen Wei; Nadia Rahman; Oscar Blom; Irene Adler; Kofi Mensah; Ravi"),
        "ORG": _items("Quantum Corp; Bluebird Labs; Meridian Bank; Falcon Group"),
        "GPE": _items("Dublin; Athens; Los Angeles; Chile; Warsaw"),
    },
    held_out={
        "PERSON": _items("Olga Petrov; Barack Obama; Ingrid Larsen; Tariq Aziz; Mateo"),
        "ORG": _items("Zenith Labs; Orion Bank; Polaris; Cobalt Industries"),
        "GPE": _items("Kyoto; Cape Town; Oslo; Portugal"),
    },
    templates=(
        "{PERSON} joined {ORG} in {GPE} .",
        "{PERSON} lives in {GPE} .",
        "{PERSON} works at {ORG} .",
        "I met {PERSON} in {GPE} last year .",
        "{ORG} opened a new office in {GPE} .",
        "Did {PERSON} call you yesterday ?",
        "Tell me more about {PERSON} .",
        "What do you know about {ORG} ?",
        "{PERSON} and {PERSON} flew to {GPE} last week .",
        "My friend {PERSON} moved to {GPE} .",
        "{PERSON} is the new manager at {ORG} .",
        "We visited {GPE} and {GPE} in the summer .",
        "{ORG} hired {PERSON} as an engineer .",
        "Yesterday {PERSON} signed a contract with {ORG} .",
        "The meeting with {ORG} is in {GPE} on Monday .",
        "Please remind me to email {PERSON} .",
        "{PERSON} said that {ORG} is growing fast .",
        "Is {GPE} a good place to live ?",
        "After the conference in {GPE} , {PERSON} went home .",
        "{PERSON} , my colleague , works for {ORG} .",
        "Last year {ORG} bought a company in {GPE} .",
        "How is {PERSON} doing ?",
        "{PERSON} grew up in {GPE} and studied at {ORG} .",
        "I think {PERSON} likes {GPE} .",
        "Noted .",
        "Good to know .",
        "Thanks , I will remember that .",
        "We talked about the weather today .",
        "That sounds like a great plan !",
        "The report is due next Friday .",
        "I will keep that in mind .",
        "Can you help me plan a trip ?",
        "Sure , here is a summary of the meeting .",
        "It was a long day at work .",
        "Let me know if anything changes .",
    ),
)

ARABIC = LanguageData(
    code="ar",
    lang_name="Arabic",
    person="PER",
    org="ORG",
    place="LOC",
    first_names=_words(
        "محمد أحمد فاطمة ليلى عمر خالد سارة يوسف مريم علي نور حسن رنا طارق هدى سامي زينب "
        "كريم سلمى ياسر منى وليد ريم جمال هالة ماجد لينا فادي سعاد إبراهيم"
    ),
    last_names=_words(
        "الأحمد حداد خوري السيد المصري العلي النجار الحسيني منصور الخطيب الشامي عيسى "
        "سليمان الرفاعي البدوي عباس الزين فرحات يونس الحلبي صالح"
    ),
    org_heads=_words("شركة بنك جامعة مؤسسة مستشفى منظمة مجموعة"),
    org_tails=_words(
        "أكمي الخليج القاهرة النور الأفق السلام المشرق الريان الأمل الفجر الوطن الشروق "
        "النخيل الرواد البركة الاتحاد"
    ),
    org_head_alone=0.0,
    places=_words(
        "باريس القاهرة دبي الرياض بيروت عمان لندن مصر الأردن تونس بغداد دمشق جدة الدوحة "
        "المغرب برلين طوكيو حلب الخرطوم الجزائر ليبيا الكويت روما مدريد"
    ),
    dev={
        "PER": _items("جود الساعدي; نبيل عواد; رزان; حمزة الفقيه"),
        "ORG": _items("شركة الصقر; بنك الإنماء; جامعة اليرموك"),
        "LOC": _items("صنعاء; نابلس; اسطنبول; العراق"),
    },
    held_out={
        "PER": _items("رامي الكردي; دانة العمر; باسل قاسم; غادة"),
        "ORG": _items("شركة النجمة; بنك الأمان; مؤسسة الغد"),
        "LOC": _items("الإسكندرية; مسقط; المنامة"),
    },
    templates=(
        "انضم {PER} إلى {ORG} في {LOC} .",
        "يعيش {PER} في {LOC} .",
        "يعمل {PER} في {ORG} .",
        "تعمل {PER} في {ORG} .",
        "التقيت {PER} في {LOC} العام الماضي .",
        "افتتحت {ORG} مكتبا جديدا في {LOC} .",
        "هل اتصل {PER} بك أمس ؟",
        "أخبرني المزيد عن {PER} .",
        "ماذا تعرف عن {ORG} ؟",
        "سافر {PER} مع {PER} إلى {LOC} الأسبوع الماضي .",
        "انتقل صديقي {PER} إلى {LOC} .",
        "{PER} هو المدير الجديد في {ORG} .",
        "زرنا {LOC} ثم {LOC} في الصيف .",
        "وقع {PER} عقدا مع {ORG} أمس .",
        "الاجتماع مع {ORG} في {LOC} يوم الاثنين .",
        "ذكرني أن أراسل {PER} .",
        "قال {PER} إن {ORG} تنمو بسرعة .",
        "هل {LOC} مكان جيد للعيش ؟",
        "بعد المؤتمر في {LOC} ، عاد {PER} إلى البيت .",
        "درس {PER} في {ORG} ثم عاد إلى {LOC} .",
        "أظن أن {PER} يحب {LOC} .",
        "كيف حال {PER} ؟",
        "حسنا ، سأتذكر ذلك .",
        "شكرا على المعلومة .",
        "تحدثنا عن الطقس اليوم .",
        "هذه خطة رائعة !",
        "التقرير مطلوب يوم الجمعة القادم .",
        "سأضع ذلك في الحسبان .",
        "هل يمكنك مساعدتي في التخطيط لرحلة ؟",
        "كان يوما طويلا في العمل .",
        "أخبرني إذا تغير شيء .",
    ),
)

LANGUAGES = {data.code: data for data in (ENGLISH, ARABIC)}

PROBES: dict[str, tuple[Probe, ...]] = {
    "en": (
        Probe(
            "Sarah Connor joined Acme Corp in Paris.",
            (("Sarah Connor", "PERSON"), ("Acme Corp", "ORG"), ("Paris", "GPE")),
        ),
        Probe("John Smith works at Globex.", (("John Smith", "PERSON"), ("Globex", "ORG"))),
        Probe("Maria Garcia lives in Tokyo.", (("Maria Garcia", "PERSON"), ("Tokyo", "GPE"))),
        Probe("Tell me more about Sarah Connor.", (("Sarah Connor", "PERSON"),)),
        Probe("Noted.", ()),
    ),
    "ar": (
        Probe(
            "انضم محمد الأحمد إلى شركة أكمي في باريس.",
            (("محمد الأحمد", "PER"), ("شركة أكمي", "ORG"), ("باريس", "LOC")),
        ),
        Probe("يعيش أحمد حداد في القاهرة.", (("أحمد حداد", "PER"), ("القاهرة", "LOC"))),
        Probe("تعمل فاطمة خوري في بنك الخليج.", (("فاطمة خوري", "PER"), ("بنك الخليج", "ORG"))),
        Probe("أخبرني المزيد عن محمد الأحمد.", (("محمد الأحمد", "PER"),)),
        Probe("شكرا على المعلومة.", ()),
    ),
}


def _entity_tokens(name: str, label: str) -> list[Token]:
    words = name.split()
    if len(words) == 1:
        return [(words[0], f"S-{label}", True)]
    tags = [f"B-{label}"] + [f"I-{label}"] * (len(words) - 2) + [f"E-{label}"]
    return [(word, tag, True) for word, tag in zip(words, tags, strict=True)]


def _training_name(data: LanguageData, slot: str, rng: random.Random) -> str:
    if slot == data.person:
        first = rng.choice(data.first_names)
        return first if rng.random() < 0.3 else f"{first} {rng.choice(data.last_names)}"
    if slot == data.org:
        head = rng.choice(data.org_heads)
        return (
            head if rng.random() < data.org_head_alone else f"{head} {rng.choice(data.org_tails)}"
        )
    return rng.choice(data.places)


def _fill(data: LanguageData, slot: str, rng: random.Random, names: str) -> str:
    if names == "dev":
        return rng.choice(data.dev[slot])
    if names == "held_out":
        return rng.choice(data.held_out[slot])
    return _training_name(data, slot, rng)


def sentence(data: LanguageData, rng: random.Random, names: str = "train") -> list[Token]:
    """One sentence from a random template, its slots filled with ``names`` ("train",
    "dev" or "held_out") names."""
    tokens: list[Token] = []
    for part in rng.choice(data.templates).split():
        if part.startswith("{"):
            slot = part.strip("{}")
            tokens.extend(_entity_tokens(_fill(data, slot, rng, names), slot))
        else:
            if part in ATTACHED and tokens:
                text, tag, _ = tokens[-1]
                tokens[-1] = (text, tag, False)
            tokens.append((part, "O", True))
    return tokens


def sentence_text(tokens: list[Token]) -> str:
    return "".join(text + (" " if space else "") for text, _, space in tokens).rstrip()


def entities(tokens: list[Token]) -> list[tuple[str, str]]:
    """The (name, type) pairs of a tagged sentence, in order."""
    found: list[tuple[str, str]] = []
    words: list[str] = []
    for text, tag, _ in tokens:
        if tag == "O":
            continue
        words.append(text)
        if tag[0] in "SE":
            found.append((" ".join(words), tag[2:]))
            words = []
    return found


def _tokenizer_labels(paragraph: list[list[Token]]) -> tuple[str, str]:
    text, labels = [], []
    for index, tokens in enumerate(paragraph):
        for position, (word, _, space) in enumerate(tokens):
            last = position == len(tokens) - 1
            text.append(word)
            labels.append("0" * (len(word) - 1) + ("2" if last else "1"))
            if (space and not last) or (last and index < len(paragraph) - 1):
                text.append(" ")
                labels.append("0")
    return "".join(text), "".join(labels)


def _paragraphs(sentences: list[list[Token]], rng: random.Random) -> list[list[list[Token]]]:
    paragraphs, start = [], 0
    while start < len(sentences):
        size = rng.randint(1, 4)
        paragraphs.append(sentences[start : start + size])
        start += size
    return paragraphs


def _write_split(out: Path, split: str, sentences: list[list[Token]], rng: random.Random) -> None:
    ner = [[{"text": word, "ner": tag} for word, tag, _ in tokens] for tokens in sentences]
    (out / "ner" / f"{split}.json").write_text(json.dumps(ner, ensure_ascii=False), "utf-8")
    pairs = [_tokenizer_labels(p) for p in _paragraphs(sentences, rng)]
    (out / "tok" / f"{split}.txt").write_text("\n\n".join(t for t, _ in pairs) + "\n", "utf-8")
    (out / "tok" / f"{split}.labels").write_text("\n\n".join(la for _, la in pairs) + "\n")


def _write_vectors(path: Path, sentences: list[list[Token]], rng: random.Random) -> None:
    vocabulary = sorted({word.lower() for tokens in sentences for word, _, _ in tokens})
    lines = [f"{len(vocabulary)} {VECTOR_DIM}"]
    for word in vocabulary:
        values = " ".join(f"{rng.gauss(0.0, 0.5):.4f}" for _ in range(VECTOR_DIM))
        lines.append(f"{word} {values}")
    path.write_text("\n".join(lines) + "\n", "utf-8")


def write_corpus(
    lang: str, out: Path, *, seed: int = 20240601, train: int = 1000, dev: int = 100
) -> dict[str, int]:
    """Write the training files for ``lang`` under ``out``; returns the counts written."""
    data = LANGUAGES[lang]
    rng = random.Random(f"{seed}-{lang}")
    for folder in ("ner", "tok"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    train_sentences = [sentence(data, rng) for _ in range(train)]
    dev_sentences = [sentence(data, rng, "dev") for _ in range(dev)]
    _write_split(out, "train", train_sentences, rng)
    _write_split(out, "dev", dev_sentences, rng)
    (out / "tok" / "mwt.json").write_text("[]\n")
    _write_vectors(out / "vectors.txt", train_sentences, rng)
    return {"train": train, "dev": dev}


def held_out_probes(lang: str, count: int = 40, *, seed: int = 7) -> list[Probe]:
    """Sentences whose every entity is a name kept out of training (templates are shared)."""
    data = LANGUAGES[lang]
    rng = random.Random(f"held-out-{seed}-{lang}")
    probes: list[Probe] = []
    while len(probes) < count:
        tokens = sentence(data, rng, "held_out")
        if entities(tokens):
            probes.append(Probe(sentence_text(tokens), tuple(entities(tokens))))
    return probes
