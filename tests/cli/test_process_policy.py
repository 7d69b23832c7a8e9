"""``parity.process_policy``: the collector policy the entry points apply around a compare (moved out of the
library, which must leave process-wide state alone)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from parity.shared.dump.reader import load_dump
from parity.shared.errors import DumpError

from parity.process_policy import collector_paused
from tests.factories import stats_leaf, write_raw_dump


@pytest.fixture
def gc_enabled() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        if not was:
            gc.disable()


def _big_dump(directory: Path, n: int = 1000) -> Path:
    data = {f"Torch.op{i}.0.forward": {"output": [stats_leaf(i * 0.5, 0.0, 0.25, 1.0)]} for i in range(n)}
    return write_raw_dump(directory, data)


def test_what_a_paused_compare_built_leaves_the_young_generation(tmp_path: Path, gc_enabled: None) -> None:
    path = _big_dump(tmp_path)
    with collector_paused():
        assert not gc.isenabled()
        dump = load_dump(path)
    assert gc.isenabled()
    c = dump.columns
    lists = [c.entry_names, c.names, c.apis, c.states, c.dtypes, c.shapes]
    young = {id(o) for o in gc.get_objects(generation=0)}
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert not [i for i, col in enumerate(lists) if id(col) in young]
    assert all(id(col) in oldest for col in lists)


def test_the_collector_resumes_after_an_error_and_a_callers_choice_is_kept(
    tmp_path: Path, gc_enabled: None
) -> None:
    bad = tmp_path / "bad" / "dump.json"
    bad.parent.mkdir()
    bad.write_text("[1]")
    with pytest.raises(DumpError), collector_paused():
        load_dump(bad)
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            load_dump(_big_dump(tmp_path / "again", 10))
        assert not gc.isenabled()
    finally:
        gc.enable()
