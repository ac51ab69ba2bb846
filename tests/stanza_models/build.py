"""Train the tiny stanza tokenizer and NER models and lay them out as a resources folder.

    python -m tests.stanza_models.build OUT_DIR [--lang en|ar ...] [--seed N] [--work DIR]

For each language: write the synthetic corpus (:mod:`tests.stanza_models.generate`), build a
pretrain file from its random vectors, train the tokenizer (``stanza.models.tokenizer``,
no MWT) and the NER tagger (``stanza.models.ner_tagger``) with stanza's own training entry
points, copy the three models to ``OUT_DIR/<lang>/{tokenize,ner,pretrain}/tiny.pt`` and add
the language to ``OUT_DIR/resources.json`` (other languages already there are kept). The
build then loads ``stanza.Pipeline(lang, processors="tokenize,ner", dir=OUT_DIR,
download_method=None)`` and fails unless every probe sentence gives exactly its entities.

Training runs on one CPU thread: more threads are slower here, and erratic on a busy machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.stanza_models.generate import LANGUAGES, PROBES, held_out_probes, write_corpus

PACKAGE = "tiny"
# Where stanza would download a missing file from: a closed port on this machine, so a
# misconfigured load fails at once instead of reaching out.
UNREACHABLE_URL = "http://127.0.0.1:9/{lang}/{filename}"

TOKENIZER_OPTIONS = [
    "--no_use_mwt",
    "--emb_dim", "16",
    "--hidden_dim", "32",
    "--steps", "500",
    # The tokenizer saves only on a better dev score: evaluating once, at the last step,
    # saves the final model.
    "--eval_steps", "500",
]  # fmt: skip

NER_OPTIONS = [
    "--word_emb_dim", "32",
    "--char_emb_dim", "16",
    "--char_hidden_dim", "32",
    "--hidden_dim", "64",
    "--optim", "adam",
    "--lr", "0.005",
    "--dropout", "0.2",
    "--word_dropout", "0.15",
    "--eval_interval", "50",
    "--max_steps", "400",
    "--max_steps_no_improve", "200",
]  # fmt: skip


def _run(command: list[str], log: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with log.open("w", encoding="utf-8") as out:
        result = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        tail = log.read_text("utf-8").splitlines()[-30:]
        raise SystemExit(f"{' '.join(command[:3])} failed; the end of {log}:\n" + "\n".join(tail))


def _train_model(module: str, shorthand: str, options: list[str], model: Path, seed: int) -> None:
    command = [sys.executable, "-m", module, "--mode", "train", "--cpu", "--seed", str(seed)]
    command += ["--shorthand", shorthand, *options]
    command += ["--save_dir", str(model.parent), "--save_name", model.name]
    _run(command, model.with_suffix(".log"))


def _train(lang: str, work: Path, seed: int) -> dict[str, Path]:
    from stanza.models.common.pretrain import Pretrain

    data, models = work / "data", work / "models"
    models.mkdir(parents=True, exist_ok=True)
    write_corpus(lang, data, seed=seed)
    shorthand = f"{lang}_{PACKAGE}"
    pretrain = models / f"{shorthand}.pretrain.pt"
    Pretrain(
        filename=str(pretrain), vec_filename=str(data / "vectors.txt"), save_to_file=True
    ).load()
    tok = data / "tok"
    tokenizer = [
        "--lang", lang,
        "--txt_file", str(tok / "train.txt"),
        "--label_file", str(tok / "train.labels"),
        "--dev_txt_file", str(tok / "dev.txt"),
        "--dev_label_file", str(tok / "dev.labels"),
        "--mwt_json_file", str(tok / "mwt.json"),
        *TOKENIZER_OPTIONS,
    ]  # fmt: skip
    tokenizer_model = models / f"{shorthand}_tokenizer.pt"
    _train_model("stanza.models.tokenizer", shorthand, tokenizer, tokenizer_model, seed)
    ner = [
        "--train_file", str(data / "ner" / "train.json"),
        "--eval_file", str(data / "ner" / "dev.json"),
        "--wordvec_pretrain_file", str(pretrain),
        *NER_OPTIONS,
    ]  # fmt: skip
    ner_model = models / f"{shorthand}_nertagger.pt"
    _train_model("stanza.models.ner_tagger", shorthand, ner, ner_model, seed)
    return {"tokenize": tokenizer_model, "ner": ner_model, "pretrain": pretrain}


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def lay_out(out: Path, lang: str, models: dict[str, Path]) -> dict[str, Any]:
    """Copy ``models`` into ``out`` and record ``lang`` in ``out/resources.json``."""
    entry: dict[str, Any] = {"lang_name": LANGUAGES[lang].lang_name}
    for processor, source in models.items():
        target = out / lang / processor / f"{PACKAGE}.pt"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        entry[processor] = {PACKAGE: {"md5": _md5(target)}}
    entry["ner"][PACKAGE]["dependencies"] = [{"model": "pretrain", "package": PACKAGE}]
    # No "mwt" here: stanza would otherwise add an MWT processor to tokenize,ner.
    entry["default_processors"] = {"tokenize": PACKAGE, "ner": PACKAGE}
    entry["packages"] = {"default": {"tokenize": PACKAGE, "ner": PACKAGE}}
    resources_file = out / "resources.json"
    resources = json.loads(resources_file.read_text("utf-8")) if resources_file.exists() else {}
    resources["url"] = UNREACHABLE_URL
    resources[lang] = entry
    text = json.dumps(resources, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    resources_file.write_text(text, "utf-8")
    return entry


def check(out: Path, lang: str) -> tuple[int, int]:
    """Fail unless every probe gives exactly its entities; return the held-out score."""
    import stanza

    pipeline = stanza.Pipeline(
        lang=lang,
        processors="tokenize,ner",
        dir=str(out),
        download_method=None,
        logging_level="WARN",
    )

    def found(text: str) -> tuple[tuple[str, str], ...]:
        return tuple((ent.text, ent.type) for ent in pipeline(text).ents)

    misses = [(p.text, found(p.text)) for p in PROBES[lang] if found(p.text) != p.entities]
    if misses:
        raise SystemExit(f"{lang}: the model missed probe sentences: {misses}")
    held_out = held_out_probes(lang)
    return sum(found(p.text) == p.entities for p in held_out), len(held_out)


def build(lang: str, out: Path, work: Path, seed: int) -> None:
    started = time.perf_counter()
    models = _train(lang, work / lang, seed)
    lay_out(out, lang, models)
    right, total = check(out, lang)
    sizes = ", ".join(
        f"{p.parent.name} {p.stat().st_size:,} B" for p in sorted((out / lang).glob("*/*.pt"))
    )
    print(
        f"{lang}: built in {time.perf_counter() - started:.1f} s; {sizes}; "
        f"held-out sentences exactly right: {right}/{total}"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the resources folder to write (or update)")
    parser.add_argument("--lang", action="append", choices=sorted(LANGUAGES), help="repeatable")
    parser.add_argument("--seed", type=int, default=20240601)
    parser.add_argument("--work", type=Path, help="keep the corpus, logs and raw models here")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch

    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stanza-build-") as scratch:
        work = args.work or Path(scratch)
        for lang in args.lang or sorted(LANGUAGES, key=lambda code: code != "en"):
            build(lang, args.out.resolve(), work.resolve(), args.seed)


if __name__ == "__main__":
    main()
