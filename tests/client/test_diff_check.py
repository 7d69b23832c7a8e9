"""The baseline side of task diff_check (client/diff_check.py): against a real md5 baseline dump, the one
call whose inputs agree and whose output does not is the culprit, and its files go with its neighbours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from parity.client.diff_check import Baseline, CallChecksums, DiffCheck
from parity.client.errors import ConfigError

from tests.client.conftest import dump_once, load_data

MD5 = {"task": "statistics", "statistics": {"summary_mode": "md5"}}


def test_one_faulty_call_is_the_culprit_and_files_go_to_it_and_its_neighbours(tmp_path: Path) -> None:
    root = dump_once(tmp_path / "bench", "mlp", "L1", config=MD5)
    data = load_data(root)
    check = DiffCheck(Baseline.load(root, step=0, rank=0), diff_nums=1)
    faulty = "Functional.relu.0.forward"
    names = list(data)
    after = names[names.index(faulty) + 1]
    culprits = []
    for name, entry in data.items():  # the target replayed: the faulty call's output, its consumer's input
        live = CallChecksums.of_entry(entry)
        if name == faulty:
            live = CallChecksums(live.inputs, {0: ("deadbeef", live.outputs[0][1])})
        if name == after:
            live = CallChecksums({**live.inputs, 0: ("deadbeef", live.inputs[0][1])}, live.outputs)
        if check.judge(name, live):
            culprits.append(name)
    assert culprits == [faulty] and check.done
    files = check.file_calls()
    assert files[0] == faulty and set(files[1:]) == set(check.baseline.flow.neighbours([faulty], 1))
    assert 1 < len(files) < len(names)


def test_a_baseline_without_checksums_is_refused_by_field(tmp_path: Path) -> None:
    root = dump_once(tmp_path / "stats", "mlp", "L1")
    with pytest.raises(ConfigError, match="tensor.bench_path.*md5"):
        Baseline.load(root, step=0, rank=0)
    with pytest.raises(ConfigError, match="tensor.bench_path.*step3"):
        Baseline.load(tmp_path / "nowhere", step=3, rank=0)
    (tmp_path / "bad.json").write_text(json.dumps({"data": []}))
    with pytest.raises(ConfigError, match="no 'data'"):
        Baseline.load(tmp_path / "bad.json", step=0, rank=0)
