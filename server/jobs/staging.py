"""A rank job's files on the worker's disk: one folder per attempt, hard links to the blobs, never copies.

A rank job lays out that rank's files only (hard links into a file store, so nothing is copied; on S3 hard
links into the worker's bounded cache, ``blob_cache``, which streams in only the blobs the job names) in a
staging folder of its own; a slice fetches its calls' tensor files only, once it knows which they are.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

from parity.server.blob_cache import Checkout, MissingBlob
from parity.server.errors import ServiceError
from parity.server.models import RunFile
from parity.server.settings import Settings
from parity.server.store import BlobStore, FileStore, comparison_key, sidecar_key
from parity.shared.dump.layout import DUMP_JSON, TENSOR_DIR

__all__ = ["JobError", "SliceFiles", "part_key", "split_tensor_files", "stage", "tmp_root"]


class JobError(ServiceError):
    """A job cannot run (its files are missing from the store, the runs disagree)."""


def tmp_root(store: BlobStore, settings: Settings) -> Path:
    """Where staging folders go: beside the blobs on a file store (the hard links stay on one filesystem)."""
    root = store.root / ".tmp" if isinstance(store, FileStore) else settings.resolved_data_dir / "tmp"
    root.mkdir(parents=True, exist_ok=True)
    return root


def stage(blobs: Checkout, run_id: str, files: Iterable[RunFile], dest: Path, label: str) -> int:
    """Lay one rank's files out as ``dest/rank{R}/...``: hard links to the blobs of a file store (read in
    place, no bytes copied, and the engine never sees a symlink) or to the worker cache's downloads."""
    from parity.shared.dump.sidecar import SIDECAR_NAME

    count = 0
    for f in files:
        rel = f.path.split("/", 1)[1]  # drop "stepN/"
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            _link(blobs.path(f.blob, f.size), target)
        except MissingBlob:
            raise JobError(f"{label} run {run_id}: {f.path} is missing from the store") from None
        count += 1
        if target.name == DUMP_JSON:
            # The dump's parsed columns, when its run's validation stored them (runs before had none).
            sidecar = blobs.find(sidecar_key(f.blob))
            if sidecar is not None:
                _link(sidecar, target.with_name(SIDECAR_NAME))
    return count


def split_tensor_files(files: Sequence[RunFile]) -> tuple[dict[str, RunFile], list[RunFile]]:
    """A rank's tensor files by their name in ``dump_tensor_data``, and its other files (dump.json, ...)."""
    tensors: dict[str, RunFile] = {}
    others: list[RunFile] = []
    for f in files:
        parts = f.path.split("/", 3)  # stepN/rankR/dump_tensor_data/name
        if len(parts) == 4 and parts[2] == TENSOR_DIR:
            tensors[parts[3]] = f
        else:
            others.append(f)
    return tensors, others


class SliceFiles:
    """A slice's tensor files, staged once it knows which of its rank's it reads."""

    def __init__(self, blobs: Checkout, *sides: tuple[str, dict[str, RunFile], Path]) -> None:
        self.blobs, self.sides = blobs, sides

    def stage(self, *names: Sequence[str]) -> None:
        for (run_id, by_name, dest), wanted in zip(self.sides, names, strict=True):
            label = "target" if dest.name == "npu" else "bench"
            # a file the dump names but the run lacks is not staged: its row says so, as for a whole rank
            chosen = [by_name[n] for n in dict.fromkeys(wanted) if n in by_name]
            stage(self.blobs, run_id, chosen, dest, label)


def part_key(comparison_id: str, rank: int, slice_: int) -> str:
    return comparison_key(comparison_id, f"rank{rank}/slice{slice_}.part")


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
