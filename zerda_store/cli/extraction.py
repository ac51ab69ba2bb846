"""``reextract`` and ``models download``: the commands about extraction. Both exit non-zero
when they did not do what they were asked (turns still failing, no model downloaded), with
one line saying why."""

from __future__ import annotations

import json
import sys
from typing import Any
from urllib.parse import urlsplit

import click

from .common import SESSION_ID, Context, json_option, plural, print_text


@click.command()
@click.option(
    "--failed",
    is_flag=True,
    required=True,
    help="Retry the turns whose extraction failed (the only mode).",
)
@click.option(
    "--session", "session_id", type=SESSION_ID, help="One session (default: every session)."
)
@click.option("--lang", default="en", show_default=True, help="Language of the stanza model.")
@click.option("--stanza-dir", type=click.Path(file_okay=False), help="stanza resources folder.")
@json_option
@click.pass_obj
def reextract(
    obj: Context,
    failed: bool,
    session_id: str | None,
    lang: str,
    stanza_dir: str | None,
    as_json: bool,
) -> None:
    """Run extraction again (with stanza) for turns whose extraction failed. Exits 1 while
    any of them still fails (e.g. the stanza model cannot load), naming why."""
    from tqdm import tqdm

    from .. import ConversationEntityMemory, StanzaExtractor
    from ..admin import AdminRepository

    store = obj.changing_store()
    store.check_writable()
    pending = AdminRepository(store).failed_turns(session_id)
    sessions_with_failures = sorted({turn.session_id for turn in pending})
    extractor = StanzaExtractor.shared(lang, stanza_dir=stanza_dir)
    receipt: dict[str, Any] = {"repaired": 0, "failed": 0, "error": None}
    for current in tqdm(
        sessions_with_failures, desc="reextract", unit=" sessions", disable=None, file=sys.stderr
    ):
        memory = ConversationEntityMemory(
            store=store, session_id=current, lang=lang, extractor=extractor
        )
        for key, count in memory.reextract().items():
            receipt[key] += count
        receipt["error"] = memory.get_memory_stats()["last_extraction_error"] or receipt["error"]
    if as_json:
        click.echo(json.dumps(receipt, ensure_ascii=False, indent=2))
    else:
        print_text(
            f"repaired {plural(receipt['repaired'], 'turn')}, {receipt['failed']} still failing"
        )
    if receipt["failed"]:
        raise click.ClickException(
            f"{plural(receipt['failed'], 'turn')} still failing: {receipt['error']}"
        )


@click.group()
def models() -> None:
    """Manage stanza models for extraction without an LLM."""


@models.command("download")
@click.argument("lang")
@click.option("--stanza-dir", type=click.Path(file_okay=False), help="Where to put the models.")
def models_download(lang: str, stanza_dir: str | None) -> None:
    """Download stanza's tokenize and NER models for LANG (needs network access)."""
    try:
        import stanza
    except ImportError:
        raise click.ClickException(
            "stanza is not installed: pip install '.[stanza]' in a checkout (or the wheel "
            "with its [stanza] extra)"
        ) from None
    options: dict[str, Any] = {"processors": "tokenize,ner"}
    if stanza_dir:
        options["model_dir"] = stanza_dir
    try:
        stanza.download(lang, **options)
    except OSError as exc:  # requests' connection errors are OSErrors too
        raise click.ClickException(
            f"cannot download stanza models for {lang!r}: {_unreachable(exc)}; it needs "
            "network access (elsewhere: download there, copy the folder here and pass "
            "--stanza-dir)"
        ) from None
    click.echo(f"stanza models for {lang!r} are installed")


def _unreachable(exc: OSError) -> str:
    """What could not be reached, in a few words (the driver's message runs to lines)."""
    request = getattr(exc, "request", None)
    host = urlsplit(getattr(request, "url", "") or "").hostname
    return f"{type(exc).__name__} reaching {host}" if host else type(exc).__name__
