"""A server's services in the test process, with no job pool (``workers=0``): uploads go through
``RunService`` and are validated at once, and the test runs the comparison's tasks itself, on as many
``TaskRunner``s side by side as it asks for (threads, each its own runner, as worker processes would be).

Used by the scheduler, slice, defect and S3-cache tests, so each reads as what it checks, not how it builds a
server. ``tests/server/conftest.py`` holds the subprocess server (``ServerProcess``) and the dump builders.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import anyio
from openpyxl import load_workbook
from parity.server.db import Database
from parity.server.jobs.base import NullQueue
from parity.server.jobs.runner import TaskRunner
from parity.server.migrate import upgrade
from parity.server.models import ComparisonRow, Job, RunFile
from parity.server.schemas import RunCreate
from parity.server.services.comparisons import ComparisonService
from parity.server.services.runs import RunService
from parity.server.settings import Settings
from parity.server.store import BlobStore, FileStore, comparison_key, open_store
from sqlalchemy import select

from tests.server.conftest import dump_files, sha
from tests.workers import validate_waiting

MAX_UPLOAD_BYTES = 1 << 30


async def body_of(data: bytes) -> AsyncIterator[bytes]:
    """An upload's body, as the route hands it to ``RunService.upload``."""
    yield data


@dataclass
class InProcess:
    """The services of a server on ``settings``; ``comparisons`` plans tasks with the default
    ``PARITY_TASK_MAX_BYTES`` (``comparison_service`` gives one with another)."""

    settings: Settings
    db: Database
    store: BlobStore
    runs: RunService
    comparisons: ComparisonService

    @classmethod
    def create(cls, data_dir: Path, **settings: Any) -> Self:
        """A migrated database and a store under ``data_dir`` (``settings`` override, e.g. ``database_url``,
        ``store_url``); ``close`` disposes of them."""
        config = Settings(data_dir=data_dir, workers=0, **settings)
        upgrade(config.resolved_database_url)
        db = Database.connect(config.resolved_database_url)
        store = open_store(config.resolved_store_url, config.resolved_data_dir / "tmp")
        runs, comparisons = RunService(db, store, MAX_UPLOAD_BYTES), ComparisonService(db, store, NullQueue())
        return cls(config, db, store, runs, comparisons)

    @classmethod
    @contextmanager
    def open(cls, data_dir: Path, **settings: Any) -> Iterator[Self]:
        """``create``, closed when the block ends."""
        server = cls.create(data_dir, **settings)
        try:
            yield server
        finally:
            server.close()

    def close(self) -> None:
        self.db.dispose()

    def comparison_service(self, task_max_bytes: int) -> ComparisonService:
        """A service that plans a rank past ``task_max_bytes`` as slices of its calls."""
        return ComparisonService(self.db, self.store, NullQueue(), task_max_bytes=task_max_bytes)

    def upload(self, root: Path, device: str) -> str:
        """Upload every file under ``root`` as a new run, complete and validate it; returns its id."""
        run = self.runs.create(RunCreate(name=f"run-{root.name}", device=device))  # type: ignore[arg-type]
        for path, data in dump_files(root):
            result = anyio.run(self.runs.upload, run.id, path, sha(data), str(len(data)), body_of(data))
            assert result.created, path
        self.runs.complete(run.id)
        validate_waiting(self.settings)  # what a worker of the job backend does next
        return run.id

    def run_tasks(self, ids: Sequence[str], workers: int = 1) -> None:
        """Run task ids in order on ``workers`` runners side by side."""
        todo, lock = list(ids), threading.Lock()

        def work() -> None:
            runner = TaskRunner(self.settings)
            try:
                while True:
                    with lock:
                        if not todo:
                            return
                        task = todo.pop(0)
                    runner.run(task)
            finally:
                runner.close()

        threads = [threading.Thread(target=work) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def rows(self, cid: str) -> list[tuple[Any, ...]]:
        """``(rank, idx, api, status, highlight, score, cells)`` of each stored row, in rank and row order."""
        t = ComparisonRow
        with self.db.read() as session:
            found = session.execute(
                select(t.rank, t.idx, t.api, t.status, t.highlight, t.score, t.cells)
                .where(t.comparison_id == cid).order_by(t.rank, t.idx)
            ).all()  # fmt: skip
        return [(*r[:-1], json.loads(r[-1])) for r in found]

    def tasks(self, cid: str) -> dict[int, tuple[str, int]]:
        """``{rank: (status, attempt)}`` of a comparison's tasks (one slice a rank)."""
        with self.db.read() as session:
            found = session.scalars(select(Job).where(Job.kind == "rank", Job.subject == cid)).all()
            return {t.rank: (t.status, t.attempt) for t in found}

    def rank_bytes(self, run_ids: Sequence[str], rank: int) -> int:
        """The bytes the runs hold for ``rank``: what a task of that rank reads."""
        with self.db.read() as session:
            where = (RunFile.run_id.in_(run_ids), RunFile.rank == rank)
            return sum(session.scalars(select(RunFile.size).where(*where)))

    def xlsx(self, cid: str, rank: int) -> list[list[Any]]:
        """Every cell of a rank's stored report, with its fill."""
        data = b"".join(self.store.iter_bytes(comparison_key(cid, f"rank{rank}/report.xlsx")))
        book = load_workbook(io.BytesIO(data))
        return [[(c.value, c.fill.fgColor.rgb) for c in row] for sheet in book for row in sheet.iter_rows()]

    def staging_left(self) -> list[Path]:
        """Task staging folders still in the file store."""
        assert isinstance(self.store, FileStore)
        return list((self.store.root / ".tmp").glob("task-*"))
