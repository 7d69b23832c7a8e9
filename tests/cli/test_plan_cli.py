"""``parity plan``'s exits: 0 and a config.json; 1 and nothing written for a comparison without suspects;
2 and one line for a summary of another format, an unknown comparison or one still running."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from parity.cli import main
from tests.e2e.app_wire import AppWire, app_wire
from tests.factories import DumpBuilder


def summary_file(path: Path, *suspects: str) -> Path:
    path.write_text(json.dumps({
        "format_version": 1, "kind": "single-rank", "rank": 0, "mode": "statistics",
        "npu_path": "/gone/step4/rank0/dump.json", "bench_path": "/gone/step4/rank0/dump.json",
        "suspects": [{"api": api, "score": 1.0} for api in suspects], "first_divergence": None,
    }))  # fmt: skip
    return path


def test_a_summary_with_suspects_writes_the_config(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "sub" / "config.json"
    args = ["plan", str(summary_file(tmp_path / "s.json", "Torch.add.0.forward")), "-o", str(out)]
    assert main([*args, "--neighbours", "0", "--dump-path", "./again"]) == 0
    config = json.loads(out.read_text())
    assert config["dump_path"] == "./again" and config["step"] == [4] and config["rank"] == []
    assert config["tensor"]["list"] == ["Torch.add.0.forward", "Torch.add.0.backward"]
    assert "suspect: Torch.add.0.forward" in capsys.readouterr().out
    # the neighbours need the dump the summary names, which is gone: one error, exit 2
    assert main([*args, "--neighbours", "1"]) == 2
    assert "needs the target dump.json" in capsys.readouterr().err


def test_no_suspects_writes_nothing_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "config.json"
    assert main(["plan", str(summary_file(tmp_path / "s.json")), "-o", str(out)]) == 1
    assert not out.exists() and "no suspects" in capsys.readouterr().err


@pytest.mark.parametrize("text", ['{"format_version": 1, "kind": "report"}', "not json", "[1]"])
def test_a_summary_of_another_format_is_one_error(tmp_path: Path, text: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    source = tmp_path / "s.json"
    source.write_text(text)
    assert main(["plan", str(source), "-o", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert str(source) in err and err.count("\n") == 1 and not (tmp_path / "c.json").exists()


@pytest.fixture
def wire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppWire]:
    """The app with no compare worker: a comparison stays queued."""
    with app_wire(tmp_path / "server", workers=0) as w:
        monkeypatch.setattr("parity.commands.server_args.connect", lambda args: w.api())
        yield w


def test_a_comparison_still_running_is_one_error(tmp_path: Path, wire: AppWire,
                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    x = np.arange(6, dtype=np.float32)
    for name in ("a", "b"):
        DumpBuilder("statistics").api("Torch.add.0.forward", [x, x], [x + x]).write(
            tmp_path / name / "step0" / "rank0")
        assert main(["upload", str(tmp_path / name), "--name", name, "--server", "http://parity"]) == 0
    capsys.readouterr()
    assert main(["compare-runs", "a", "b", "--server", "http://parity"]) == 0
    comparison = capsys.readouterr().out.strip()
    assert main(["plan", comparison, "-o", str(tmp_path / "c.json"), "--server", "http://parity"]) == 2
    err = capsys.readouterr().err
    assert comparison in err and "queued" in err and err.count("\n") == 1
    assert main(["plan", "nope", "-o", str(tmp_path / "c.json"), "--server", "http://parity"]) == 2
    assert "not found" in capsys.readouterr().err
