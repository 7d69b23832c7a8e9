"""``complete``'s validation runs in a child process: the same words as the reader's errors, and the API
process never parses a dump.json (its memory stays flat while a large one is read)."""

from __future__ import annotations

from pathlib import Path

import pytest
from parity.server.jobs import validation

from tests.factories import stats_leaf, write_raw_dump


def test_a_valid_dump_passes_and_a_broken_one_is_named_with_its_problem(tmp_path: Path) -> None:
    good = write_raw_dump(
        tmp_path / "good", {"Torch.add.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0)]}}
    )
    bad = tmp_path / "bad" / "dump.json"
    bad.parent.mkdir()
    bad.write_text('{"task": "statistics", "data": {"Torch.add.0.forward": ')
    assert validation.validate_dumps([("step0/rank0/dump.json", good)]) is None
    problem = validation.validate_dumps([("step0/rank0/dump.json", good), ("step0/rank1/dump.json", bad)])
    assert problem is not None and problem.startswith("step0/rank1/dump.json: ")
    assert "malformed JSON" in problem and str(tmp_path) not in problem  # no server-side path


def test_the_api_process_does_not_parse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good = write_raw_dump(
        tmp_path / "good", {"Torch.add.0.forward": {"output": [stats_leaf(1.0, 0.0, 0.5, 1.0)]}}
    )
    import parity.shared.dump.reader as reader

    def refuse(*args: object) -> None:
        raise AssertionError("load_dump ran in the API process")

    monkeypatch.setattr(reader, "load_dump", refuse)  # this process only; the spawned child imports afresh
    assert validation.validate_dumps([("step0/rank0/dump.json", good)]) is None
