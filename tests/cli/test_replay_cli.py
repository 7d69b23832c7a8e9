"""``parity replay -i compare.json ENTRY...``: one verdict per entry, ``--json``, and exit code 2 with one
line for a bad request (unknown entry, not an entry name, bad compare.json, step directories and no rank)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from parity.cli import main
from tests.replay_dumps import GELU, dump_model, write_compare_json, wrong_forward_gelu


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("replay_cli")
    bench = dump_model(root / "bench")
    target = dump_model(root / "target", gelu=wrong_forward_gelu())
    return write_compare_json(root / "compare.json", target, bench)


def test_prints_one_verdict_per_entry(spec: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "parity", "replay", "-i", str(spec), GELU, "Functional.dropout.0.forward",
         "Functional.linear.0.backward"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3, proc.stdout
    assert re.match(rf"{GELU}: \[target\] target output [0-9.e+-]+ from its float64 replay, bench "
                    r"[0-9.e+-]+ \(rounding allows 3\.2e-06: float32, K=1\)", lines[0]), lines[0]
    assert lines[0].endswith("the target's kernel is wrong")
    assert lines[1].startswith("Functional.dropout.0.forward: [not-replayed] not replayed: randomness: ")
    assert lines[2].startswith("Functional.linear.0.backward: [neither] target input gradients ")


def test_json_output(spec: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "-i", str(spec), GELU, "--json"]) == 0
    (verdict,) = json.loads(capsys.readouterr().out)
    assert verdict["entry"] == GELU and verdict["verdict"] == "target"
    assert verdict["target"]["distance"] > verdict["target"]["allowance"] > verdict["bench"]["distance"]


@pytest.mark.parametrize(("args", "fragment"), [
    (["Functional.gelu.7.forward"], "no entry Functional.gelu.7.forward in either dump.json"),
    (["not-an-entry"], "'not-an-entry' is not a dump entry name"),
    ([GELU, "--rank", "0"], "--rank applies to step directories"),
])  # fmt: skip
def test_a_bad_request_is_one_line_and_exit_2(spec: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                              fragment: str) -> None:  # fmt: skip
    assert main(["replay", "-i", str(spec), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("parity replay: error: ") and fragment in err[0], err


def test_a_bad_compare_json_and_step_directories_without_a_rank(
    tmp_path: Path, spec: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = write_compare_json(tmp_path / "c.json", tmp_path / "nope" / "dump.json", tmp_path / "dump.json")
    assert main(["replay", "-i", str(missing), GELU]) == 2
    assert "'npu_path'" in capsys.readouterr().err
    doc = json.loads(spec.read_text())
    steps = {key: str(Path(value).parent.parent) for key, value in doc.items()}
    (tmp_path / "steps.json").write_text(json.dumps(steps))
    assert main(["replay", "-i", str(tmp_path / "steps.json"), GELU]) == 2
    assert "choose a rank with --rank ([0])" in capsys.readouterr().err
    assert main(["replay", "-i", str(tmp_path / "steps.json"), GELU, "--rank", "0"]) == 0
    assert capsys.readouterr().out.startswith(f"{GELU}: [target]")


def test_parity_compare_prints_the_replay_of_its_suspects(
    spec: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare", "-i", str(spec), "-o", str(tmp_path / "out"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "  Float64 replay (each side's recorded output against its own inputs" in out
    assert f"  - [target] {GELU}: target output " in out
    off = ["compare", "-i", str(spec), "-o", str(tmp_path / "off"), "--no-progress", "--replay", "0"]
    assert main(off) == 0
    assert "Float64 replay" not in capsys.readouterr().out
    assert main(["compare", "-i", str(spec), "-o", str(tmp_path / "bad"), "--replay", "-1"]) == 2
    assert "--replay must be 0 or more" in capsys.readouterr().err
