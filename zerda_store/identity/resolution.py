"""Which existing entity each mention of a save or a recall names (``identity.resolve``
over the candidates that one statement reads), and each session's key rules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ..db.execution.unit_of_work import Transaction
from ..errors import KeyRulesMismatchError
from ..model.names import EXACT, KEY_RULES, KeyRules
from ..model.records import Mention
from .rules import Candidate, Identity, resolve
from .statements import IdentityStatements


class Target(NamedTuple):
    """The entity a mention joins: its key and its display name."""

    key: str
    name: str


def identity_of(mention: Mention) -> Identity:
    return Identity(mention.key, mention.core_key, mention.markers)


class Resolver:
    """Resolves mentions to the keys of the entities they join, in a unit of work."""

    def __init__(self, statements: IdentityStatements, rules: KeyRules) -> None:
        self.statements = statements
        self.rules = rules

    def targets(
        self,
        transaction: Transaction,
        session_id: str,
        mentions: Sequence[Mention],
        *,
        by_probe: bool = False,
    ) -> dict[str, Target]:
        """The entity each mention joins, for the mentions that join an entity under
        another key (an alias, a titled form); the others keep their own key. ``by_probe``:
        the candidates found by a probe per key (``IdentityStatements.candidates_by_probe``;
        not on tables Citus distributes)."""
        if not mentions:
            return {}
        keys = sorted({m.key for m in mentions} | {m.core_key for m in mentions})
        statement = self.statements.candidates_by_probe if by_probe else self.statements.candidates
        rows = transaction.run(statement, {"session_id": session_id, "keys": keys})
        return self.targets_among(rows, mentions)

    def targets_among(self, rows: Sequence[Any], mentions: Sequence[Mention]) -> dict[str, Target]:
        """:meth:`targets`, among candidate rows already read (``entity_key``,
        ``entity_name``, ``core_key``, ``name``: ``IdentityStatements.candidates``)."""
        if not rows:
            return {}
        candidates = _grouped(rows)
        names = {row.entity_key: row.entity_name for row in rows}
        targets = {}
        for mention in mentions:
            target = resolve(identity_of(mention), candidates, self.rules)
            if target is not None and target != mention.key:
                targets[mention.key] = Target(target, names[target])
        return targets

    def record_joins(
        self,
        transaction: Transaction,
        session_id: str,
        joined: Sequence[tuple[Mention, int]],
        at: float,
    ) -> None:
        """Keep each titled or suffixed form that joined an entity as its alias, so that
        the entity's names tell which title it goes by."""
        for mention, entity_id in joined:
            transaction.run(
                self.statements.add_alias,
                {
                    "session_id": session_id,
                    "entity_id": entity_id,
                    "alias_key": mention.key,
                    "core_key": mention.core_key,
                    "alias": mention.name,
                    "source": "mention",
                    "created_at": at,
                },
            )


def _grouped(rows: Sequence[Any]) -> list[Candidate]:
    names: dict[str, list[str]] = {}
    cores: dict[str, str] = {}
    for row in rows:
        found = names.setdefault(row.entity_key, [])
        if row.name not in found:  # found by key and by core alike
            found.append(row.name)
        cores.setdefault(row.entity_key, row.core_key)
    return [Candidate(key, cores[key], tuple(found)) for key, found in names.items()]


class KnownKeyRules:
    """The sessions whose key rules this store has checked (made once per store through
    :meth:`Store.statements`): a session's first save in a process checks them, the
    others do not."""

    def __init__(self, _dialect: object) -> None:
        self.checked: set[tuple[str, str]] = set()


def check_key_rules(
    transaction: Transaction,
    statements: IdentityStatements,
    session_id: str,
    rules: KeyRules,
    at: float,
) -> None:
    """Record ``rules`` as the session's if it has none yet; refuse other rules than the
    recorded ones (a session is never keyed two ways)."""
    transaction.count(
        statements.record_rules,
        {"session_id": session_id, "key_rules": rules.name, "created_at": at},
    )
    recorded = transaction.run(statements.rules_of, {"session_id": session_id})[0].key_rules
    refuse_other_rules(session_id, recorded, rules)


def refuse_other_rules(session_id: str, recorded: str | None, rules: KeyRules) -> None:
    """KeyRulesMismatchError if the session was keyed (``recorded``) with other rules than
    ``rules``; a session with none recorded takes any."""
    if recorded is not None and recorded != rules.name:
        raise KeyRulesMismatchError(_mismatch(session_id, recorded, rules))


def _mismatch(session_id: str, recorded: str, rules: KeyRules) -> str:
    known = KEY_RULES.get(recorded)
    option = "normalize_names=False" if known is EXACT else "normalize_names=True"
    return (
        f"session {session_id!r} is keyed with the {recorded!r} key rules, this memory with "
        f"{rules.name!r}: open it with {option} (or ConversationEntityMemory.for_session)"
    )
