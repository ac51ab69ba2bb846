"""`db check`'s differences read as sentences, never as SQLAlchemy object reprs."""

from __future__ import annotations

import sqlalchemy as sa

from zerda_store.db.migration.drift import describe


def test_each_difference_is_one_readable_line():
    table = sa.Table(
        "turns", sa.MetaData(), sa.Column("a", sa.Integer()), sa.Column("b", sa.Text())
    )
    diffs = [
        ("remove_column", None, "turns", sa.Column("surprise", sa.Integer())),
        ("add_table", table),
        ("remove_index", sa.Index("ix_turns_a", table.c.a)),
        [("modify_nullable", None, "turns", "b", {}, True, False)],
    ]
    assert describe(diffs) == [
        "the table turns has a column surprise (INTEGER) that the code does not define",
        "the table turns is missing",
        "the database has an index ix_turns_a on turns (a) that the code does not define",
        "the column turns.b is nullable in the database, NOT NULL in the code",
    ]
