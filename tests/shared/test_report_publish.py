"""Reports are published atomically with the mode any file of their folder gets: ``mkstemp``'s 0600 made the
summary JSON unreadable to the group where the xlsx beside it was not (issue 36)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from parity.shared.report import publish_atomically, write_text_atomically


def test_a_report_has_the_mode_of_a_plain_file(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_text_atomically(tmp_path / "out" / "compare_summary.json", "{}\n")
        plain = tmp_path / "out" / "plain.txt"
        plain.write_text("x")
    finally:
        os.umask(old)
    mode = (tmp_path / "out" / "compare_summary.json").stat().st_mode & 0o777
    assert mode == plain.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")] == []


def test_a_failed_write_leaves_what_was_there(tmp_path: Path) -> None:
    target = tmp_path / "report.xlsx"
    target.write_text("before")
    with pytest.raises(RuntimeError), publish_atomically(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("writer failed")
    assert target.read_text() == "before" and sorted(p.name for p in tmp_path.iterdir()) == ["report.xlsx"]
