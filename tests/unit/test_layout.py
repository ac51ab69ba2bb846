"""The shape of the package: no import circle, and a root that exports every public name
(the layers themselves are import-linter's contracts in pyproject.toml). A module is cut by
what it answers, not by its length: no line count is checked."""

from __future__ import annotations

from pathlib import Path

import grimp
import pytest

import zerda_store
import zerda_store.errors

PACKAGE = Path(zerda_store.__file__).parent


def test_no_module_imports_one_that_imports_it_back():
    # grimp counts every import: at module level, inside functions, under TYPE_CHECKING.
    graph = grimp.build_graph("zerda_store")
    circles = sorted(
        (module, imported)
        for module in graph.modules
        for imported in graph.find_modules_directly_imported_by(module)
        if graph.chain_exists(importer=imported, imported=module)
    )
    assert circles == []


@pytest.mark.parametrize(
    "name",
    [
        "AdminRepository",
        "CommitOutcomeUnknownError",
        "ConversationEntityMemory",
        "DatabaseUnavailableError",
        "Entity",
        "ExtractedEntity",
        "ExtractionResult",
        "ExtractionService",
        "Extractor",
        "KeyRulesMismatchError",
        "LLMExtractor",
        "LockTimeoutError",
        "MergeError",
        "NotAStoreDatabaseError",
        "PoolerModeError",
        "ReadOnlyStoreError",
        "SchemaNotCurrentError",
        "SessionNotEmptyError",
        "StanzaExtractor",
        "Store",
        "StoreError",
        "Telemetry",
        "migrate",
    ],
)
def test_the_root_exports_each_public_name(name):
    assert name in zerda_store.__all__
    assert getattr(zerda_store, name) is not None


@pytest.mark.parametrize("name", ["KeyRulesMismatchError", "MergeError"])
def test_the_identity_errors_are_store_errors_importable_from_errors(name):
    error = getattr(zerda_store.errors, name)
    assert getattr(zerda_store, name) is error
    assert issubclass(error, zerda_store.StoreError)
    assert issubclass(error, ValueError)


def test_migrate_at_the_root_is_the_face_of_the_schema_operations():
    from zerda_store.db.migration import migrate as migrations

    assert zerda_store.migrate.__name__ == "zerda_store.migrate"
    assert zerda_store.migrate.upgrade is migrations.upgrade
    assert set(zerda_store.migrate.__all__) <= set(dir(zerda_store.migrate))
