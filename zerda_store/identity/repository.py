"""Aliases, merges and the merge log of a session: each operation one unit of work holding
the session's lock exclusively, so that no save resolves a name halfway through it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..db.execution.unit_of_work import SessionLock, Transaction
from ..db.store import StoreCore
from ..errors import MergeError
from ..model.names import KeyRules
from ..model.records import Mention
from .merging import MANUAL, MergeReceipt, merge, unmerge
from .resolution import Resolver
from .rules import identify
from .similar import judged_pair
from .statements import DIFFERENT, SAME, IdentityStatements

# The merge log's reason for a merge a person confirmed (``confirm_same``).
CONFIRMED = "confirmed same"


@dataclass(frozen=True)
class MergeEntry:
    """One merge of the log."""

    merge_id: int
    kept: str
    merged: str
    reason: str
    created_at: float
    undone_at: float | None
    moved_snippets: int


@dataclass(frozen=True)
class Judgement:
    """A person's judgement of two entities: "same" (merged by ``merge_id``) or
    "different" (never suggested again)."""

    a: str
    b: str
    verdict: str
    decided_by: str
    decided_at: float
    merge_id: int | None = None


@dataclass(frozen=True)
class AliasEntry:
    """One alias of a session."""

    entity: str
    alias: str
    source: str


class IdentityRepository:
    """Aliases and merges of one store's sessions, under one set of key rules."""

    def __init__(self, store: StoreCore, rules: KeyRules) -> None:
        self.store = store
        self.rules = rules
        self._statements = store.statements(IdentityStatements)

    def _entity(self, transaction: Transaction, session_id: str, name: str) -> Any:
        """The entity row ``name`` names by its key or an alias's; MergeError if none."""
        key = _keyed(self.rules.key(name), name)
        statements = self._statements
        rows = transaction.run(statements.entity_by_key, {"session_id": session_id, "key": key})
        if not rows:
            alias = transaction.run(
                statements.alias_by_key, {"session_id": session_id, "alias_key": key}
            )
            if alias:
                values = {"session_id": session_id, "entity_id": alias[0].entity_id}
                rows = transaction.run(statements.entity_by_id, values)
        if not rows:
            raise MergeError(f"no entity {name!r} in session {session_id!r}")
        return rows[0]

    def _write(self, session_id: str, work: Any) -> Any:
        return self.store.write(work, SessionLock(session_id, exclusive=True))

    def add_alias(self, session_id: str, name: str, alias: str, at: float) -> bool:
        """Make ``alias`` another name of the entity ``name`` names; False if it is one
        already. Refused (MergeError) if the alias names another entity."""
        identity = identify(alias, self.rules)
        _keyed(identity.key, alias)

        def work(transaction: Transaction) -> bool:
            entity = self._entity(transaction, session_id, name)
            if identity.key == entity.name_key:
                return False
            values = {"session_id": session_id, "key": identity.key}
            other = transaction.run(self._statements.entity_by_key, values)
            if other:
                raise MergeError(
                    f"{alias!r} is the entity {other[0].name!r}: merge the two entities instead"
                )
            values = {"session_id": session_id, "alias_key": identity.key}
            taken = transaction.run(self._statements.alias_by_key, values)
            if taken:
                if taken[0].entity_id == entity.id:
                    return False
                raise MergeError(f"{alias!r} is an alias of another entity already")
            self._refuse_a_form_of_another(transaction, session_id, alias, entity.name_key)
            transaction.run(
                self._statements.add_alias,
                {
                    "session_id": session_id,
                    "entity_id": entity.id,
                    "alias_key": identity.key,
                    "core_key": identity.core,
                    "alias": alias,
                    "source": MANUAL,
                    "created_at": at,
                },
            )
            return True

        return bool(self._write(session_id, work))

    def _refuse_a_form_of_another(
        self, transaction: Transaction, session_id: str, alias: str, key: str
    ) -> None:
        """An alias that is a titled or suffixed form of another entity's name ("Dr. Sarah
        Chen" while "Sarah Chen" exists) is refused: as a mention it joins that entity,
        and as an alias it would take its mentions away."""
        identity = identify(alias, self.rules)
        mention = Mention(alias, identity.key, core=identity.core, markers=identity.markers)
        resolver = Resolver(self._statements, self.rules)
        target = resolver.targets(transaction, session_id, [mention]).get(identity.key)
        if target is not None and target.key != key:
            raise MergeError(
                f"{alias!r} is a form of the entity {target.name!r}: a mention of it names "
                "that entity (merge the two entities instead)"
            )

    def remove_alias(self, session_id: str, alias: str) -> bool:
        """Remove an alias (of whichever entity holds it); False if there is none."""
        key = self.rules.key(alias)

        def work(transaction: Transaction) -> bool:
            values = {"session_id": session_id, "alias_key": key}
            found = transaction.run(self._statements.alias_by_key, values)
            if not found:
                return False
            values = {"session_id": session_id, "alias_id": found[0].id}
            transaction.count(self._statements.remove_alias, values)
            return True

        return bool(self._write(session_id, work))

    def aliases(self, session_id: str) -> list[AliasEntry]:
        """The session's aliases, oldest first, with their entities' names."""

        def work(transaction: Transaction) -> list[AliasEntry]:
            rows = transaction.run(self._statements.session_aliases, {"session_id": session_id})
            names: dict[int, str] = {}
            for row in rows:
                if row.entity_id not in names:
                    values = {"session_id": session_id, "entity_id": row.entity_id}
                    entity = transaction.run(self._statements.entity_by_id, values)
                    names[row.entity_id] = entity[0].name if entity else "?"
            return [AliasEntry(names[row.entity_id], row.alias, row.source) for row in rows]

        return list(self.store.read(work, snapshot=True))

    def merge(self, session_id: str, keep: str, other: str, at: float) -> MergeReceipt:
        """Merge the entity ``other`` names into the one ``keep`` names."""

        def work(transaction: Transaction) -> MergeReceipt:
            kept = self._entity(transaction, session_id, keep)
            merged = self._entity(transaction, session_id, other)
            if kept.id == merged.id:
                raise MergeError(_one_entity(keep, other, kept.name))
            return merge(transaction, self._statements, kept, merged, reason=MANUAL, at=at)

        receipt: MergeReceipt = self._write(session_id, work)
        return receipt

    def unmerge(self, session_id: str, merge_id: int, at: float) -> MergeEntry:
        """Undo a merge of the log; what it undid."""

        def work(transaction: Transaction) -> MergeEntry:
            values = {"session_id": session_id, "merge_id": merge_id}
            logged = transaction.run(self._statements.merge_by_id, values)
            if not logged:
                raise MergeError(f"no merge {merge_id} in session {session_id!r}")
            unmerge(transaction, self._statements, logged[0], at=at)
            return _entry(logged[0], undone_at=at)

        entry: MergeEntry = self._write(session_id, work)
        return entry

    def names_and_cores(self, session_id: str) -> list[tuple[str, str, str]]:
        """Every entity's name, stored core key and key, in first-seen order."""
        statement, values = self._statements.names_and_cores, {"session_id": session_id}
        rows = self.store.read(lambda transaction: transaction.run(statement, values))
        return [(row.name, row.core_key, row.name_key) for row in rows]

    # -- judgements ----------------------------------------------------------------------

    def confirm_same(self, session_id: str, a: str, b: str, by: str, at: float) -> Judgement:
        """Merge the entity ``b`` names into the one ``a`` names (through the merge log,
        reason "confirmed same") and record the judgement, in one unit of work."""

        def work(transaction: Transaction) -> Judgement:
            kept = self._entity(transaction, session_id, a)
            merged = self._entity(transaction, session_id, b)
            if kept.id == merged.id:  # named once, as a merge refusal names it (H17)
                raise MergeError(_one_entity(a, b, kept.name))
            receipt = merge(transaction, self._statements, kept, merged, reason=CONFIRMED, at=at)
            return self._judge(transaction, session_id, kept, merged, SAME, by, at, receipt)

        judgement: Judgement = self._write(session_id, work)
        return judgement

    def reject_same(self, session_id: str, a: str, b: str, by: str, at: float) -> Judgement:
        """Record that the entities ``a`` and ``b`` name are two: the pair is never
        suggested again in the session."""

        def work(transaction: Transaction) -> Judgement:
            one = self._entity(transaction, session_id, a)
            other = self._entity(transaction, session_id, b)
            if one.id == other.id:
                raise MergeError(f"{a!r} and {b!r} are one entity (undo its merge first)")
            return self._judge(transaction, session_id, one, other, DIFFERENT, by, at)

        judgement: Judgement = self._write(session_id, work)
        return judgement

    def _judge(
        self,
        transaction: Transaction,
        session_id: str,
        one: Any,
        other: Any,
        verdict: str,
        by: str,
        at: float,
        receipt: MergeReceipt | None = None,
    ) -> Judgement:
        (key_a, name_a), (key_b, name_b) = sorted(
            [(one.name_key, one.name), (other.name_key, other.name)]
        )
        merge_id = receipt.merge_id if receipt is not None else None
        transaction.count(
            self._statements.judge,
            {
                "session_id": session_id,
                "key_a": key_a,
                "key_b": key_b,
                "name_a": name_a,
                "name_b": name_b,
                "verdict": verdict,
                "merge_id": merge_id,
                "decided_by": by,
                "decided_at": at,
            },
        )
        return Judgement(one.name, other.name, verdict, by, at, merge_id)

    def undo_judgement(self, session_id: str, a: str, b: str, at: float) -> Judgement:
        """Undo the judgement of the names ``a`` and ``b`` (as judged): a confirmation's
        merge is undone, a rejection removed (the pair may be suggested again)."""
        key_a, key_b = judged_pair(_keyed(self.rules.key(a), a), _keyed(self.rules.key(b), b))

        def work(transaction: Transaction) -> Judgement:
            values = {"session_id": session_id, "key_a": key_a, "key_b": key_b}
            found = transaction.run(self._statements.judgement_of, values)
            if not found:
                raise MergeError(f"no judgement of {a!r} and {b!r} in session {session_id!r}")
            row = found[0]
            if row.verdict == SAME and row.merge_id is not None:
                logged = transaction.run(
                    self._statements.merge_by_id,
                    {"session_id": session_id, "merge_id": row.merge_id},
                )
                if logged and logged[0].undone_at is None:
                    unmerge(transaction, self._statements, logged[0], at=at)
            transaction.count(self._statements.unjudge, values)
            return _judgement(row)

        judgement: Judgement = self._write(session_id, work)
        return judgement

    def judgements(self, session_id: str) -> list[Judgement]:
        """The session's judgements, oldest first."""
        statement, values = self._statements.judgements, {"session_id": session_id}
        rows = self.store.read(lambda transaction: transaction.run(statement, values))
        return [_judgement(row) for row in rows]

    def rejected_pairs(self, session_id: str) -> set[tuple[str, str]]:
        """The key pairs judged "different" in the session."""
        statement, values = self._statements.rejected_pairs, {"session_id": session_id}
        rows = self.store.read(lambda transaction: transaction.run(statement, values))
        return {(row.key_a, row.key_b) for row in rows}

    def merges(self, session_id: str) -> list[MergeEntry]:
        """The session's merge log, oldest first."""
        rows = self.store.read(
            lambda transaction: transaction.run(self._statements.merges, {"session_id": session_id})
        )
        return [_entry(row) for row in rows]


def _one_entity(keep: str, other: str, name: str) -> str:
    """The refusal of a merge of an entity into itself, naming it once, with each name the
    caller gave that is not its own ("'SARAH' and 'Sally' both name 'Sarah'")."""
    given = list(dict.fromkeys(n for n in (keep, other) if n != name))
    if not given:
        return f"{name!r} is one entity: there is nothing to merge"
    if len(given) == 1:
        return f"{given[0]!r} names {name!r}: they are one entity already"
    return f"{given[0]!r} and {given[1]!r} both name {name!r}: they are one entity already"


def _keyed(key: str, name: str) -> str:
    """``key``, unless it is empty: a name of punctuation or invisible characters alone
    names nothing."""
    if not key:
        raise MergeError(f"{name!r} has no letters or digits to name an entity by")
    return key


def _judgement(row: Any) -> Judgement:
    merge_id = int(row.merge_id) if row.merge_id is not None else None
    return Judgement(
        row.name_a, row.name_b, row.verdict, row.decided_by, float(row.decided_at), merge_id
    )


def _entry(row: Any, undone_at: float | None = None) -> MergeEntry:
    return MergeEntry(
        int(row.id),
        row.kept_name,
        row.merged_name,
        row.reason,
        float(row.created_at),
        undone_at if undone_at is not None else row.undone_at,
        len(row.record["moved_contexts"]),
    )
