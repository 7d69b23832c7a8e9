"""msprobe 26's divergence dump (client/diff_check.py): against a real md5 baseline dump, the one call whose
inputs agree and whose output does not is the culprit, and its files go with its neighbours; a live run
against an md5 or xor baseline writes tensor files for those calls only, statistics for every call."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from parity.client import PrecisionDebugger
from parity.client.diff_check import Baseline, CallChecksums, DiffCheck
from parity.client.errors import ConfigError

from tests.client.conftest import dump_once, load_data, model_and_input, train_step

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


def _run(root: Path, summary_mode: str, bench: Path | None, faulty: bool, diff_nums: int = 1) -> Path:
    """One training step of the tiny transformer; ``faulty``: its LayerNorm's eps changed (one call whose
    inputs agree with the baseline's and whose output does not)."""
    section: dict[str, object] = {"summary_mode": summary_mode}
    if bench is not None:
        section.update(bench_path=str(bench), diff_nums=diff_nums)
    task = "tensor" if bench is not None else "statistics"
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"task": task, "level": "mix", task: section}))
    PrecisionDebugger.reset()
    PrecisionDebugger(str(root / "config.json"), dump_path=str(root))
    model, x = model_and_input("transformer")
    if faulty:
        model.ln.eps = 0.5
    PrecisionDebugger.start(model)
    train_step(model, x)
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    PrecisionDebugger.drain()
    PrecisionDebugger.reset()
    return root


@pytest.mark.parametrize("summary_mode", ["md5", "xor"])
def test_a_run_against_a_baseline_writes_the_culprit_and_its_neighbours_only(tmp_path: Path,
                                                                             summary_mode: str) -> None:
    bench = _run(tmp_path / "bench", summary_mode, None, faulty=False)
    target = _run(tmp_path / "target", summary_mode, bench, faulty=True)
    base, data = load_data(bench), load_data(target)
    assert list(data) == list(base)  # every call keeps its entry (statistics and checksums)
    files = {p.name for p in (target / "step0" / "rank0" / "dump_tensor_data").iterdir()}
    named = {leaf["data_name"] for leaf in _leaves(data) if "data_name" in leaf}
    assert files == named and files  # every file named in dump.json, no name without its file
    check = DiffCheck(Baseline.load(bench, step=0, rank=0))
    (culprit,) = [n for n, e in data.items() if ".forward" in n and check.judge(n, CallChecksums.of_entry(e))]
    assert culprit.startswith("Functional.layer_norm.")  # the first call the changed eps makes differ
    expected = set(check.file_calls([culprit]))  # the culprit and parity plan's neighbours of it
    by_entry = {n for n in data if any(f.startswith(n + ".") for f in files)}
    assert by_entry == expected, (by_entry ^ expected)
    assert len(by_entry) < len(data) / 4


def test_a_step_the_baseline_lacks_writes_no_tensor_file(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                        ) -> None:  # fmt: skip
    bench = _run(tmp_path / "bench", "xor", None, faulty=False)
    (bench / "step0").rename(bench / "step7")
    with caplog.at_level("WARNING", logger="parity.client.recorder"):
        target = _run(tmp_path / "target", "xor", bench, faulty=True)
    assert not any((target / "step0" / "rank0" / "dump_tensor_data").iterdir())
    assert not any("data_name" in leaf for leaf in _leaves(load_data(target)))
    assert any("step 0 (rank 0) gets statistics and checksums only" in r.getMessage() for r in caplog.records)


def _leaves(data: dict) -> list[dict]:
    out: list[dict] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "torch.Tensor":
                out.append(node)
            else:
                for v in node.values():
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(data)
    return out
