"""How well the memory tells entities apart, on labelled pairs of mentions.

For each pair (a, b) whose strings differ, a fresh session sees a, then b: the pair is
merged when b joins a's entity (the key rules, aliases by title and legal suffix: see
``zerda_store.identity.rules``), and the other order must agree. Precision is the share of
merged pairs labelled "same"; recall the share of "same" pairs merged. Printed per
phenomenon, for the default rules and for the ones before them.

``--variants`` reports the suggestions instead, on ``tests/data/identity-variant-pairs.json``
(transliteration, nickname/short form, acronym, confusable), per split ("tune": pairs seen
while building the rules; "held-out": never used to tune): for each phenomenon the pairs
merged, the pairs suggested (listed by ``similar_entities()`` in a session holding the two
names) and the pairs found (merged or suggested).

    python benchmarks/identity.py [PAIRS.json ...] [--misses] [--rules fold-v2]
    python benchmarks/identity.py --variants [--misses]
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from zerda_store.identity.rules import Candidate, identify, resolve
from zerda_store.identity.similar import similar_pairs
from zerda_store.model.names import FOLD_V2, KEY_RULES, KeyRules

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FILES = [ROOT / "tests/data/identity-pairs.json"]
VARIANT_FILE = ROOT / "tests/data/identity-variant-pairs.json"


@dataclass
class Tally:
    same: int = 0
    merged_same: int = 0
    different: int = 0
    merged_different: int = 0
    misses: list[str] = field(default_factory=list)
    false_merges: list[str] = field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.same += other.same
        self.merged_same += other.merged_same
        self.different += other.different
        self.merged_different += other.merged_different

    @property
    def precision(self) -> float:
        merged = self.merged_same + self.merged_different
        return self.merged_same / merged if merged else 1.0

    @property
    def recall(self) -> float:
        return self.merged_same / self.same if self.same else 1.0


def load_pairs(paths: list[Path]) -> list[dict[str, object]]:
    pairs: list[dict[str, object]] = []
    for path in paths:
        pairs.extend(json.loads(path.read_text(encoding="utf-8"))["pairs"])
    return pairs


def joins(first: str, second: str, rules: KeyRules) -> bool:
    """Whether ``second``, seen after ``first`` in a fresh session, names its entity."""
    known = identify(first, rules)
    candidate = Candidate(known.key, known.core, (first,))
    return resolve(identify(second, rules), [candidate], rules) == known.key


def merged(a: str, b: str, rules: KeyRules) -> bool:
    return joins(a, b, rules) and joins(b, a, rules)


def evaluate(pairs: list[dict[str, object]], rules: KeyRules) -> dict[str, Tally]:
    """Tallies per phenomenon, over the pairs whose two strings differ."""
    tallies: dict[str, Tally] = {}
    for pair in pairs:
        a, b = str(pair["a"]), str(pair["b"])
        if a == b:
            continue
        tally = tallies.setdefault(str(pair["phenomenon"]), Tally())
        together = merged(a, b, rules)
        line = f"{pair['id']}: {a!r} / {b!r}"
        if pair["label"] == "same":
            tally.same += 1
            tally.merged_same += together
            if not together:
                tally.misses.append(line)
        else:
            tally.different += 1
            tally.merged_different += together
            if together:
                tally.false_merges.append(line)
    return tallies


def total(tallies: dict[str, Tally]) -> Tally:
    whole = Tally()
    for tally in tallies.values():
        whole.add(tally)
    return whole


def report(tallies: dict[str, Tally], rules: KeyRules, misses: bool) -> None:
    print(f"\nrules {rules.name}")
    print(f"{'phenomenon':26} {'same':>5} {'recall':>7} {'diff':>5} {'merged':>7} {'precision':>9}")
    for name, tally in sorted(tallies.items()):
        print(
            f"{name:26} {tally.same:5} {tally.recall:7.2f} {tally.different:5} "
            f"{tally.merged_different:7} {tally.precision:9.3f}"
        )
    whole = total(tallies)
    print(
        f"{'all':26} {whole.same:5} {whole.recall:7.2f} {whole.different:5} "
        f"{whole.merged_different:7} {whole.precision:9.3f}"
    )
    for tally in tallies.values():
        for line in tally.false_merges:
            print("  false merge", line)
        if misses:
            for line in tally.misses:
                print("  missed", line)


@dataclass
class Found:
    """One phenomenon's pairs of one split: how many, merged, suggested (not merged)."""

    pairs: int = 0
    merged: int = 0
    suggested: int = 0
    lines: list[str] = field(default_factory=list)

    @property
    def found(self) -> int:
        return self.merged + self.suggested


def suggested(a: str, b: str, rules: KeyRules = FOLD_V2) -> str | None:
    """The reason ``similar_entities()`` lists the pair for, in a session of the two."""
    pairs = similar_pairs([a, b], rules)
    return pairs[0].reason if pairs else None


def evaluate_variants(pairs: list[dict[str, object]]) -> dict[tuple[str, str], Found]:
    """Per (split, phenomenon): pairs merged and suggested."""
    found: dict[tuple[str, str], Found] = {}
    for pair in pairs:
        a, b = str(pair["a"]), str(pair["b"])
        tally = found.setdefault((str(pair["split"]), str(pair["phenomenon"])), Found())
        tally.pairs += 1
        line = f"{pair['id']}: {a!r} / {b!r}"
        if merged(a, b, FOLD_V2):
            tally.merged += 1
            line += " merged"
        elif (reason := suggested(a, b)) is not None:
            tally.suggested += 1
            line += f" suggested ({reason})"
        else:
            line += " neither"
        tally.lines.append(line)
    return found


def report_variants(found: dict[tuple[str, str], Found], misses: bool) -> None:
    print(f"{'split':9} {'phenomenon':16} {'pairs':>5} {'merged':>6} {'suggested':>9} {'found':>6}")
    for (split, phenomenon), tally in sorted(found.items()):
        share = tally.found / tally.pairs if tally.pairs else 0.0
        print(
            f"{split:9} {phenomenon:16} {tally.pairs:5} {tally.merged:6} {tally.suggested:9} "
            f"{tally.found:6} ({share:.2f})"
        )
        if misses:
            wrong = "neither" if phenomenon != "confusable" else ("merged", "suggested")
            for line in tally.lines:
                if line.endswith(wrong) or (phenomenon == "confusable" and "neither" not in line):
                    print("   ", line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, default=DEFAULT_FILES)
    parser.add_argument("--misses", action="store_true", help="list the pairs not merged")
    parser.add_argument("--rules", action="append", choices=sorted(KEY_RULES))
    parser.add_argument("--variants", action="store_true", help="the suggestions' report")
    options = parser.parse_args()
    if options.variants:
        variant_pairs = json.loads(VARIANT_FILE.read_text(encoding="utf-8"))["pairs"]
        report_variants(evaluate_variants(variant_pairs), options.misses)
        return
    pairs = load_pairs(options.files)
    print(f"{len(pairs)} pairs; by label: {dict(Counter(str(p['label']) for p in pairs))}")
    for name in options.rules or ["fold-v2", "fold-v1"]:
        report(evaluate(pairs, KEY_RULES[name]), KEY_RULES[name], options.misses)


if __name__ == "__main__":
    main()
