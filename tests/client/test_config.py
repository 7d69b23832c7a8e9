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
        ({"levle": "L1"}, r"field 'levle': unknown field; allowed: task, dump_path"),
        (
            {"task": "overflow_check"},
            r"field 'task': 'overflow_check' is not allowed; allowed: statistics, tensor",
        ),
        ({"level": "L2"}, r"field 'level': 'L2' is not allowed; allowed: L0, L1, mix"),
        ({"statistics": {"data_mode": ["all", "forward"]}}, r"statistics.data_mode.*cannot be combined"),
        ({"statistics": {"data_mode": ["fwd"]}}, r"statistics.data_mode.*allowed: all, forward, backward"),
        ({"statistics": {"summary_mode": "xor"}}, r"statistics.summary_mode': 'xor' is not allowed"),
        ({"statistics": {"scope": ["a"]}}, r"statistics.scope': must list exactly 2"),
        ({"statistics": {"lists": []}}, r"statistics.lists': unknown field; allowed: scope, list"),
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
