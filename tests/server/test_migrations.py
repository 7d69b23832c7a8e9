"""Migrations: one tree upgrades an empty database and one left at the first revision, on both backends,
and the head revision matches the ORM models (an empty autogenerate diff)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from parity.server.migrate import alembic_config, head_revision, upgrade
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
    assert revision(url) == head_revision() == "0015"
    assert_matches_models(url)
    upgrade(url)  # a second upgrade is a no-op
    assert revision(url) == "0015"


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
    assert revision(url) == "0015"
    assert_matches_models(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT status FROM comparisons WHERE id = 'c1'")).one()
        blob = conn.execute(text("SELECT blob FROM run_files WHERE run_id = 'r1'")).scalar_one()
        flags = conn.execute(text("SELECT baseline, auto_compare FROM runs WHERE id = 'r1'")).one()
        against = conn.execute(text("SELECT against_baseline FROM comparisons WHERE id = 'c1'")).scalar_one()
        tasks = conn.execute(text("SELECT rank, status, lease_expires_at FROM jobs WHERE subject = 'c1'"))
        tasks = tasks.all()
        keep = conn.execute(text("SELECT keep FROM runs WHERE id = 'r1'")).scalar_one()
    assert not keep  # 0006: existing runs are not marked to keep
    # 0007: an existing run is no baseline and compares on complete; an existing comparison was not.
    assert (bool(flags[0]), bool(flags[1]), bool(against)) == (False, True, False)
    assert tuple(row) == ("queued",)
    # queued before 0005: fanned out into rank tasks (0005), which are jobs (0012), with no lease
    assert [tuple(t) for t in tasks] == [(0, "queued", None)]
    engine.dispose()
    # A file stored before 0003 keeps the key it was published under.
    assert blob == "runs/r1/step0/rank0/dump.json"


@pytest.mark.parametrize("backend", BACKENDS)
def test_0012_moves_tasks_and_validations_into_jobs_and_back(backend: str, tmp_path: Path) -> None:
    url = database_url(backend, tmp_path)
    upgrade(url, "0011")
    engine = create_engine(url)
    with engine.begin() as conn:
        for run, status, lease in (("r1", "complete", None), ("r2", "validating", None),
                                   ("r3", "validating", "2030-01-01 00:00:00+00:00")):  # fmt: skip
            conn.execute(text(
                "INSERT INTO runs (id, name, project, device, tags, metadata, status, created_at, "
                "validation_attempt, validation_lease_expires_at, validation_worker) VALUES (:id, 'n', 'p', "
                "'npu', '{}', '{}', :status, CURRENT_TIMESTAMP, 2, :lease, :worker)"
            ), {"id": run, "status": status, "lease": lease, "worker": "w" if lease else None})  # fmt: skip
        conn.execute(text(
            "INSERT INTO comparisons (id, target_run_id, bench_run_id, options, status, progress, "
            "created_at, attempt) VALUES ('c1', 'r1', 'r1', '{}', 'running', 0, CURRENT_TIMESTAMP, 0)"
        ))  # fmt: skip
        for rank, slice_, status, summary in ((0, 0, "succeeded", '{"rows": 3}'), (1, 0, "running", None),
                                              (1, 1, "queued", None)):  # fmt: skip
            conn.execute(text(
                "INSERT INTO comparison_tasks (comparison_id, rank, slice, slices, status, attempt, "
                "progress, summary, queued_at) VALUES ('c1', :rank, :slice, :slices, :status, 1, 0.5, "
                ":summary, CURRENT_TIMESTAMP)"
            ), {"rank": rank, "slice": slice_, "slices": 1 + rank, "status": status,
                "summary": summary})  # fmt: skip
    engine.dispose()
    upgrade(url)
    assert_matches_models(url)
    engine = create_engine(url)
    with engine.connect() as conn:
        jobs = conn.execute(text(
            "SELECT id, kind, subject, rank, slice, slices, status, attempt, worker, summary FROM jobs "
            "ORDER BY id"
        )).all()  # fmt: skip
    engine.dispose()
    rows = [(*row[:-1], json.loads(row[-1]) if isinstance(row[-1], str) else row[-1]) for row in jobs]
    assert rows == [
        ("c1:0", "rank", "c1", 0, 0, 1, "succeeded", 1, None, {"rows": 3}),
        ("c1:1", "rank", "c1", 1, 0, 2, "running", 1, None, None),
        ("c1:1.1", "rank", "c1", 1, 1, 2, "queued", 1, None, None),
        ("validate:r2", "validate", "r2", None, 0, 1, "queued", 2, None, None),
        ("validate:r3", "validate", "r3", None, 0, 1, "running", 2, "w", None),
    ]
    command.downgrade(alembic_config(url), "0011")
    engine = create_engine(url)
    with engine.connect() as conn:
        tasks = conn.execute(text("SELECT rank, slice, status FROM comparison_tasks ORDER BY rank, slice"))
        tasks = tasks.all()
        runs = conn.execute(text("SELECT id, validation_attempt, validation_worker FROM runs ORDER BY id"))
        runs = runs.all()
    engine.dispose()
    assert [tuple(t) for t in tasks] == [(0, 0, "succeeded"), (1, 0, "running"), (1, 1, "queued")]
    # a complete run's validation was not a job: its claims count from 0 again
    assert [tuple(r) for r in runs] == [("r1", 0, None), ("r2", 2, None), ("r3", 2, "w")]


def test_migrations_dir_is_found_from_the_package() -> None:
    from parity.server.migrate import MIGRATIONS_DIR

    assert MIGRATIONS_DIR == REPO / "migrations" and (MIGRATIONS_DIR / "env.py").is_file()
