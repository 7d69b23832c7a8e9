"""config.json and constructor arguments fail at construction, naming the field and the allowed values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from parity.client import PrecisionDebugger
from parity.client.config import load_config, parse_index_list
from parity.client.errors import CaptureError, ClientError, ConfigError


def _cfg(tmp_path: Path, doc: dict[str, Any]) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize(
    ("doc", "pattern"),
    [
        ({"levle": "L1"}, r"field 'levle': unknown field; did you mean 'level'\? known: task, dump_path"),
        ({"async_dumps": True}, r"field 'async_dumps': unknown field; did you mean 'async_dump'\?"),
        ({"enable_dataloder": False}, r"did you mean 'enable_dataloader'\?"),  # msprobe's field, misspelt
        ({"statistics": {"tensor_lst": []}}, r"'statistics.tensor_lst'.*did you mean 'tensor_list'\?"),
        ({"zzz": 1}, r"field 'zzz': unknown field; known: task"),
        (
            {"task": "overflow_check"},
            r"field 'task': 'overflow_check' is not allowed; allowed: statistics, tensor",
        ),
        ({"level": "L2"}, r"field 'level': 'L2' not supported: the kernel-level"),
        ({"statistics": {"data_mode": ["all", "forward"]}}, r"statistics.data_mode.*cannot be combined"),
        ({"statistics": {"data_mode": ["fwd"]}}, r"statistics.data_mode.*allowed: all, forward, backward"),
        ({"statistics": {"summary_mode": "crc64"}}, r"statistics.summary_mode': 'crc64' is not allowed"),
        ({"statistics": {"scope": ["a"]}}, r"statistics.scope': must list exactly 2"),
        ({"statistics": {"lists": []}}, r"statistics.lists': unknown field; did you mean 'list'\? known"),
        ({"step": ["3-1"]}, r"field 'step': bad item '3-1'"),
        ({"rank": "0"}, r"field 'rank': must be a list"),
        ({"async_dump": "yes"}, r"field 'async_dump': must be true or false"),
        ({"async_dump": True, "statistics": {"summary_mode": "md5"}}, r"async_dump.*md5"),
        ({"extra_info": 1}, r"extra_info"),
    ],
)
def test_invalid_config_fails_at_construction(tmp_path: Path, doc: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ConfigError, match=pattern) as info:
        PrecisionDebugger(_cfg(tmp_path, doc))
    assert isinstance(info.value, ClientError) and str(tmp_path) in str(info.value)


def test_constructor_arguments_override_and_are_validated(tmp_path: Path) -> None:
    cfg = load_config(_cfg(tmp_path, {"task": "tensor", "level": "L0", "step": [0, "2-3"]}), level="mix")
    assert (cfg.task, cfg.level, cfg.steps) == ("tensor", "mix", frozenset({0, 2, 3}))
    with pytest.raises(ConfigError, match="field 'level'"):
        PrecisionDebugger(level="L9")
    with pytest.raises(ConfigError, match="config_path.*cannot read"):
        PrecisionDebugger(str(tmp_path / "missing.json"))


def test_index_lists() -> None:
    assert parse_index_list([], "step") is None
    assert parse_index_list([1, "4", "6-8"], "step") == frozenset({1, 4, 6, 7, 8})


def test_server_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_SERVER", "http://parity:8000")
    assert load_config().server == "http://parity:8000"


def test_singleton_and_model_required(tmp_path: Path) -> None:
    a = PrecisionDebugger(dump_path=str(tmp_path), level="L0")
    assert PrecisionDebugger(level="L1") is a and a.config.level == "L0"  # second construction is a no-op
    with pytest.raises(CaptureError, match="pass the model"):
        PrecisionDebugger.start()
    PrecisionDebugger.reset()
    with pytest.raises(CaptureError, match="must be constructed"):
        PrecisionDebugger.start()


def test_seed_all_is_reproducible() -> None:
    import torch
    from parity.client import seed_all

    seed_all(7)
    a = torch.randn(3)
    seed_all(7)
    assert torch.equal(a, torch.randn(3))


MSPROBE_833_CONFIG = Path(__file__).parent / "data" / "msprobe833_config.json"  # as mindstudio-probe ships it

# msprobe 26.x documents these on top of 8.3.3's (dump-format.md §2, msprobe's config docs)
MSPROBE_26_CONFIG: dict[str, Any] = {
    "task": "tensor", "dump_path": "./dump_path", "rank": [], "step": [0], "level": "mix",
    "async_dump": False, "precision": "low", "extra_info": True, "risk_level": "ALL",
    "is_deterministic": True, "seed": 1234, "dump_enable": True, "custom_op_namespaces": ["_C_ascend"],
    "tensor": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "md5", "file_format": "npy",
               "bench_path": "", "diff_nums": 1, "slice": [], "backward_input": ""},
    "statistics": {"scope": [], "list": [], "tensor_list": ["relu"], "data_mode": ["all"],
                   "summary_mode": "statistics"},
    "acc_check": {"white_list": [], "black_list": [], "error_data_path": "./"},
    "nan_check": {"scope": [], "list": []},
}  # fmt: skip


def test_msprobe_833_shipped_config_is_accepted_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="parity.client.config"):
        cfg = load_config(MSPROBE_833_CONFIG)
    assert (cfg.task, cfg.level, cfg.async_dump) == ("statistics", "L1", False)
    assert cfg.summary_mode == "statistics"
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    for name in ("enable_dataloader", "tensor.file_format", "overflow_check", "run_ut", "grad_probe",
                 "free_benchmark"):  # fmt: skip
        assert name in warnings[0]
    for acted_on in ("async_dump", "data_mode", "summary_mode", "'level'"):
        assert acted_on not in warnings[0]


def test_msprobe_26_documented_fields_are_accepted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="parity.client.config"):
        cfg = load_config(_cfg(tmp_path, MSPROBE_26_CONFIG))
    assert (cfg.task, cfg.level, cfg.summary_mode, cfg.steps) == ("tensor", "mix", "md5", frozenset({0}))
    reload_note, warning = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "dump_enable: the dump is on; Parity does not reload config.json" in reload_note
    for name in ("is_deterministic", "seed", "custom_op_namespaces", "tensor.file_format", "tensor.diff_nums",
                 "acc_check", "nan_check"):  # fmt: skip
        assert name in warning
    for acted_on in ("precision", "risk_level", "bench_path", "statistics.tensor_list"):
        assert acted_on not in warning


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"task": "diff_check"}, "diff_check.bench_path", "Ascend NPU flag"),
        ({"level": "debug"}, "level", "PrecisionDebugger.save"),
        ({"load": {"path": ".", "modules": ["Module.fc.Linear.forward.0"]}}, "load", "module input override"),
        ({"precision": "high"}, "precision", "no Mean and Norm"),
        ({"risk_level": "FOCUS"}, "risk_level", "CORE/FOCUS"),
        ({"dump_enable": False}, "dump_enable", "hot reload"),
        ({"tensor": {"bench_path": "./no-such-baseline", "summary_mode": "md5"}}, "tensor.bench_path",
         "does not exist"),
        ({"tensor": {"bench_path": ".", "summary_mode": "statistics"}}, "tensor.summary_mode",
         "compares checksums"),
        ({"tensor": {"bench_path": ".", "summary_mode": "xor", "diff_nums": 0}}, "tensor.diff_nums",
         "-1 .no limit. or a positive integer"),
        ({"tensor": {"slice": [[0, 2]]}}, "tensor.slice", "slicing"),
    ],
)
def test_msprobe_26_settings_parity_does_not_carry_out_are_refused_by_name(tmp_path, change, field, says):
    doc = {**MSPROBE_26_CONFIG, **change}
    with pytest.raises(ConfigError, match=says) as info:
        load_config(_cfg(tmp_path, doc))
    assert info.value.field == field


@pytest.mark.parametrize("form", ["tensor", "diff_check"])
def test_a_bench_path_is_a_divergence_dump(tmp_path: Path, form: str) -> None:
    """msprobe 26.2.0's form (task tensor, ``tensor.bench_path``) and the issue's (``task: "diff_check"``)."""
    section = {"summary_mode": "xor", "bench_path": str(tmp_path), "diff_nums": -1}
    doc = ({"task": "tensor", "tensor": section} if form == "tensor" else
           {"task": "diff_check", "diff_check": {"diff_nums": -1, "summary_mode": "xor"},
            "tensor": {"bench_path": str(tmp_path)}})  # fmt: skip
    cfg = load_config(_cfg(tmp_path, doc))
    assert (cfg.task, cfg.bench_path, cfg.diff_nums, cfg.summary_mode) == ("tensor", tmp_path, -1, "xor")


def test_xor_and_tensor_list_are_acted_on(tmp_path: Path) -> None:
    doc = {"task": "statistics", "statistics": {"summary_mode": "xor", "tensor_list": ["relu"]}}
    cfg = load_config(_cfg(tmp_path, doc))
    # tensor_list: statistics for every call, tensor files for the calls whose names contain an item
    assert (cfg.summary_mode, cfg.task, cfg.api_list, cfg.statistics_for_all) == ("xor", "tensor", ("relu",),
                                                                                  True)  # fmt: skip


def test_parity_fields_only_warn_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    doc = {"task": "statistics", "level": "L1", "statistics": {"data_mode": ["all"]}}
    with caplog.at_level("WARNING", logger="parity.client.config"):
        load_config(_cfg(tmp_path, doc))
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_save_records_nothing_outside_level_debug_and_says_so(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    import torch

    PrecisionDebugger.reset()
    PrecisionDebugger(dump_path=str(tmp_path))
    with caplog.at_level("WARNING", logger="parity.client.debugger"):
        PrecisionDebugger.save(torch.ones(2), "x")
        PrecisionDebugger.save(torch.ones(2), "y")
    said = [r.getMessage() for r in caplog.records if "save(" in r.getMessage()]
    assert len(said) == 1 and 'level "debug"' in said[0]
    with pytest.raises(ConfigError, match="name must be a string"):
        PrecisionDebugger.save(torch.ones(2), 3)  # type: ignore[arg-type]
    PrecisionDebugger.reset()
