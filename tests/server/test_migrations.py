"""Migrations: one tree upgrades an empty database and one left at the first revision, on both backends,
and the head revision matches the ORM models (an empty autogenerate diff)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from parity.server.migrate import head_revision, upgrade
from parity.server.models import Base
from sqlalchemy import create_engine, inspect, text

from tests.server.conftest import REPO, fresh_postgres_database, postgres_url_or_skip

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def database_url(backend: str, tmp_path: Path) -> str:
    if backend == "postgres":
        return fresh_postgres_database(postgres_url_or_skip())
    return f"sqlite:///{tmp_path / 'sub' / 'parity.db'}"


def revision(url: str) -> str | None:
    engine = create_engine(url)
    with engine.connect() as conn:
        rev = MigrationContext.configure(conn).get_current_revision()
    engine.dispose()
    return rev


def assert_matches_models(url: str) -> None:
    engine = create_engine(url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata)
    engine.dispose()
    assert diff == [], diff


@pytest.mark.parametrize("backend", BACKENDS)
def test_upgrade_empty_database(backend: str, tmp_path: Path) -> None:
    url = database_url(backend, tmp_path)
    # Through the command line, from an unrelated working directory.
    env = {"PATH": "/usr/bin:/bin", "PARITY_DATABASE_URL": url, "PARITY_DATA_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "parity", "db", "upgrade"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert revision(url) == head_revision() == "0014"
    assert_matches_models(url)
    upgrade(url)  # a second upgrade is a no-op
    assert revision(url) == "0014"


@pytest.mark.parametrize("backend", BACKENDS)
def test_upgrade_from_first_revision_keeps_data(backend: str, tmp_path: Path) -> None:
    url = database_url(backend, tmp_path)
    upgrade(url, "0001")
    assert revision(url) == "0001"
    engine = create_engine(url)
    with engine.begin() as conn:
        assert "comparison_rows" not in inspect(conn).get_table_names()
        conn.execute(text(
            "INSERT INTO runs (id, name, project, device, tags, metadata, status, created_at) "
            "VALUES ('r1', 'n', 'p', 'npu', '{}', '{}', 'complete', CURRENT_TIMESTAMP)"
        ))  # fmt: skip
        conn.execute(text(
            "INSERT INTO comparisons (id, target_run_id, bench_run_id, options, status, progress, "
            "created_at) VALUES ('c1', 'r1', 'r1', '{}', 'queued', 0, CURRENT_TIMESTAMP)"
        ))  # fmt: skip
        conn.execute(text(
            "INSERT INTO run_files (run_id, path, size, sha256, step, rank, created_at) "
            "VALUES ('r1', 'step0/rank0/dump.json', 2, :sha, 0, 0, CURRENT_TIMESTAMP)"
        ), {"sha": "0" * 64})  # fmt: skip
    engine.dispose()
    upgrade(url)
    assert revision(url) == "0014"
    assert_matches_models(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT status, attempt, lease_expires_at FROM comparisons WHERE id = 'c1'")
        ).one()
        blob = conn.execute(text("SELECT blob FROM run_files WHERE run_id = 'r1'")).scalar_one()
        flags = conn.execute(text("SELECT baseline, auto_compare FROM runs WHERE id = 'r1'")).one()
        against = conn.execute(text("SELECT against_baseline FROM comparisons WHERE id = 'c1'")).scalar_one()
        tasks = conn.execute(text("SELECT rank, status FROM comparison_tasks WHERE comparison_id = 'c1'"))
        tasks = tasks.all()
        keep = conn.execute(text("SELECT keep FROM runs WHERE id = 'r1'")).scalar_one()
    assert not keep  # 0006: existing runs are not marked to keep
    # 0007: an existing run is no baseline and compares on complete; an existing comparison was not.
    assert (bool(flags[0]), bool(flags[1]), bool(against)) == (False, True, False)
    assert tuple(row) == ("queued", 0, None)  # no lease until a worker claims it
    assert [tuple(t) for t in tasks] == [(0, "queued")]  # queued before 0005: fanned out into rank tasks
    engine.dispose()
    # A file stored before 0003 keeps the key it was published under.
    assert blob == "runs/r1/step0/rank0/dump.json"


def test_migrations_dir_is_found_from_the_package() -> None:
    from parity.server.migrate import MIGRATIONS_DIR

    assert MIGRATIONS_DIR == REPO / "migrations" and (MIGRATIONS_DIR / "env.py").is_file()
