"""Each config filter: scope, list, data_mode, rank, step."""

from __future__ import annotations

from pathlib import Path

from tests.client.conftest import dump_once, load_data


def test_scope_keeps_the_inclusive_range_and_counters_still_advance(tmp_path: Path) -> None:
    full = list(load_data(dump_once(tmp_path / "full", "mlp", "L1")))
    fwd = [n for n in full if n.endswith(".forward")]
    first, last = fwd[1], fwd[2]
    cfg = {"task": "statistics", "statistics": {"scope": [first, last]}}
    data = load_data(dump_once(tmp_path / "scoped", "mlp", "L1", config=cfg))
    assert [n for n in data if n.endswith(".forward")] == [first, last]
    assert set(data) <= set(full)  # same names: filtered calls still consumed their numbers


def test_list_matches_full_names_and_substrings(tmp_path: Path) -> None:
    cfg = {"task": "statistics", "statistics": {"list": ["relu", "Functional.linear.1.forward"]}}
    data = load_data(dump_once(tmp_path, "mlp", "L1", config=cfg))
    assert set(data) == {"Functional.relu.0.forward", "Functional.relu.0.backward",
                         "Functional.linear.1.forward", "Functional.linear.1.backward"}  # fmt: skip


def test_list_module_at_mix_dumps_everything_inside(tmp_path: Path) -> None:
    cfg = {"task": "statistics", "statistics": {"list": ["Module.ff.Sequential.forward.0"]}}
    data = load_data(dump_once(tmp_path, "transformer", "mix", config=cfg))
    assert "Module.ff.Sequential.forward.0" in data
    assert "Functional.gelu.0.forward" in data and "Functional.linear.2.forward" in data
    assert "Functional.embedding.0.forward" not in data


def test_data_mode_forward_input_only(tmp_path: Path) -> None:
    cfg = {"task": "statistics", "statistics": {"data_mode": ["forward", "input"]}}
    data = load_data(dump_once(tmp_path, "mlp", "mix", config=cfg))
    assert data and all(n.endswith(".forward") or ".forward." in n for n in data)
    assert all(set(entry) == {"input_args", "input_kwargs"} for entry in data.values())


def test_data_mode_backward_only(tmp_path: Path) -> None:
    cfg = {"task": "statistics", "statistics": {"data_mode": ["backward"]}}
    data = load_data(dump_once(tmp_path, "mlp", "mix", config=cfg))
    assert "Functional.linear.0.backward" in data and "Module.fc1.Linear.backward.0" in data
    assert "Module.fc1.Linear.parameters_grad" in data
    assert not [n for n in data if n.endswith(".forward") or ".forward." in n]


def test_rank_filter_skips_other_ranks(tmp_path: Path) -> None:
    dump_once(tmp_path / "r1", "mlp", "L1", config={"rank": [1]})
    assert not (tmp_path / "r1" / "step0").exists()
    dump_once(tmp_path / "r0", "mlp", "L1", config={"rank": [0]})
    assert (tmp_path / "r0" / "step0" / "rank0" / "dump.json").is_file()


def test_step_filter_and_counters_reset_per_step(tmp_path: Path) -> None:
    root = dump_once(tmp_path, "mlp", "L1", steps=4, config={"step": [1, "3-5"]})
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step")) == ["step1", "step3"]
    assert list(load_data(root, 1)) == list(load_data(root, 3))  # counters restart at 0 every step
