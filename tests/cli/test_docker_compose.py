"""docker-compose.yml: Postgres with a health check, a one-shot `zerda-store db upgrade`
service, and an app that waits for both and reads ZERDA_STORE_DATABASE_URL.

Services are found by what they do, not by their names."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import make_url

from zerda_store.db.connections.urls import DATABASE_URL_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO_ROOT / "docker-compose.yml"


def interpolate(value: str) -> str:
    """Compose's ${VAR:-default} / ${VAR-default} / ${VAR} with an empty environment."""
    return re.sub(r"\$\{(\w+)(?::?-([^}]*))?\}", lambda m: m.group(2) or "", value)


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: interpolate(str(v)) for k, v in env.items()}


def command_words(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return shlex.split(command) if isinstance(command, str) else [str(w) for w in command]


def conditions(service: dict[str, Any]) -> dict[str, str | None]:
    depends = service.get("depends_on") or {}
    if isinstance(depends, list):
        return dict.fromkeys(depends)
    return {name: (spec or {}).get("condition") for name, spec in depends.items()}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    assert COMPOSE_FILE.is_file(), f"{COMPOSE_FILE} is missing"
    document = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(document, dict)
    assert isinstance(document.get("services"), dict)
    return document


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def postgres(services) -> str:
    found = [
        name
        for name, service in services.items()
        if str(service.get("image", "")).split(":")[0].split("/")[-1] == "postgres"
    ]
    assert len(found) == 1, f"expected one Postgres service, found {found}"
    return found[0]


@pytest.fixture(scope="module")
def migration(services) -> str:
    upgrade = ["zerda-store", "db", "upgrade"]
    found = [
        name
        for name, service in services.items()
        if command_words(service)[-3:] == upgrade
        or command_words(service)[-4:] == [*upgrade, "head"]
    ]
    assert len(found) == 1, f"expected one service running `zerda-store db upgrade`: {found}"
    return found[0]


@pytest.fixture(scope="module")
def apps(services, postgres, migration) -> list[str]:
    found = [name for name in services if name not in (postgres, migration)]
    assert found, "no application service"
    return found


def test_postgres_has_a_health_check(services, postgres):
    service = services[postgres]
    check = service.get("healthcheck")
    assert isinstance(check, dict), "the Postgres service has no healthcheck"
    test = check.get("test")
    words = test if isinstance(test, list) else ["CMD-SHELL", test]
    assert words[0] in ("CMD", "CMD-SHELL")
    assert "pg_isready" in " ".join(str(w) for w in words[1:])
    env = environment(service)
    assert env.get("POSTGRES_PASSWORD") or env.get("POSTGRES_HOST_AUTH_METHOD") == "trust"


def test_postgres_keeps_its_data_in_a_named_volume(compose, services, postgres):
    named = []
    for mount in services[postgres].get("volumes") or []:
        if isinstance(mount, dict):
            source, target = mount.get("source"), mount.get("target")
        else:
            source, _, rest = str(mount).partition(":")
            target = rest.split(":")[0]
        if target == "/var/lib/postgresql/data":
            named.append(source)
    assert named, "Postgres data is not on a volume"
    assert named[0] in (compose.get("volumes") or {})


def test_the_migration_is_a_one_shot_job_after_postgres_is_healthy(services, postgres, migration):
    service = services[migration]
    assert service.get("restart", "no") in ("no", False)
    assert conditions(service).get(postgres) == "service_healthy"
    assert DATABASE_URL_ENV in environment(service)


def test_the_app_waits_for_the_migration_and_for_postgres(services, postgres, migration, apps):
    for app in apps:
        waits = conditions(services[app])
        assert waits.get(migration) == "service_completed_successfully", app
        assert waits.get(postgres) == "service_healthy", app
        assert DATABASE_URL_ENV in environment(services[app]), app


def test_every_url_points_at_the_postgres_service(services, postgres, migration, apps):
    pg_env = environment(services[postgres])
    urls = {name: environment(services[name])[DATABASE_URL_ENV] for name in (migration, *apps)}
    assert len(set(urls.values())) == 1, urls
    url = make_url(next(iter(urls.values())))
    assert url.get_backend_name() == "postgresql"
    assert url.host == postgres
    assert url.port in (None, 5432)
    assert url.username == pg_env.get("POSTGRES_USER", "postgres")
    assert url.database == pg_env.get("POSTGRES_DB", url.username)
    if "POSTGRES_PASSWORD" in pg_env:
        assert url.password == pg_env["POSTGRES_PASSWORD"]


def test_built_services_install_the_postgres_driver(services, migration, apps):
    for name in (migration, *apps):
        build = services[name].get("build")
        if build is None:
            continue
        context = build if isinstance(build, str) else build.get("context", ".")
        dockerfile = (
            "Dockerfile" if isinstance(build, str) else build.get("dockerfile", "Dockerfile")
        )
        text = (REPO_ROOT / context / dockerfile).read_text(encoding="utf-8")
        assert re.search(r"\[[^\]]*postgres[^\]]*\]|psycopg", text), name
