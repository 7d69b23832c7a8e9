"""The team's daily loop from the command line, by name, against the real app in process: ``parity runs
baseline``, ``compare-runs --wait`` right after ``parity upload --wait 0`` (the runs still validating), its
word on the step compared, the regression it lists first against the baseline, ``parity accept --note`` /
``--revoke``, and ``parity gc --dry-run``.

The app runs with no worker of its own: the test validates the runs and runs the comparison's tasks in this
process when it chooses (``validate_waiting``, ``TaskRunner``), so "still validating" is a state the test
holds, not a race it hopes to win.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from parity.client.errors import UploadError
from parity.server.jobs.runner import TaskRunner

from parity.cli import main
from parity.commands.compare_runs import changed_lines
from tests.e2e.app_wire import URL
from tests.e2e.conftest import Loop, write_model_dump
from tests.workers import run_waiting, validate_waiting

GELU = "Functional.gelu.0.forward"


def upload(root: Path, name: str, *extra: str) -> int:
    return main(["upload", str(root), "--server", URL, "--name", name, "--project", "mlp", "-q", *extra])


def two_nightlies(tmp_path: Path) -> None:
    """A baseline and a nightly whose gelu drifts, two steps each, uploaded without waiting (validating)."""
    for name, noise in (("base", 0.0), ("nightly-1", 0.05)):
        for step in (0, 1):
            write_model_dump(tmp_path / name, step=step, gelu_noise=noise)
        assert upload(tmp_path / name, name, "--wait", "0") == 0


def compared(loop: Loop, target: str = "nightly-1", bench: str = "base") -> str:
    """The nightly compared with the baseline, its tasks run here: an API is accepted only once a comparison
    of the project has called it (the server answers 422 otherwise). Returns the comparison's id."""
    api = loop.api()
    c = api.create_comparison(api.resolve_run(target, project="mlp").id,
                              api.resolve_run(bench, project="mlp").id)  # fmt: skip
    run_waiting(loop.settings)
    assert api.get_comparison(c.id).status == "succeeded"
    return c.id


def test_compare_runs_waits_for_validation_and_names_the_step(
    tmp_path: Path, loop: Loop, capsys: pytest.CaptureFixture[str]
) -> None:
    two_nightlies(tmp_path)
    capsys.readouterr()  # the uploads' run ids
    api = loop.api()
    nightly = api.resolve_run("nightly-1", project="mlp")
    assert nightly.status == "validating"
    argv = ["compare-runs", "nightly-1", "base", "--project", "mlp", "--server", URL, "--wait",
            "-o", str(tmp_path / "out"), "--timeout", "120"]  # fmt: skip
    result: list[int] = []
    cli = threading.Thread(target=lambda: result.append(main(argv)))
    cli.start()
    polled = ("GET", f"/api/v1/runs/{nightly.id}")
    deadline = time.monotonic() + 60
    while loop.wire.requests.count(polled) < 2 and cli.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)  # compare-runs is polling the validating run
    assert loop.wire.requests.count(polled) >= 2 and cli.is_alive()
    assert validate_waiting(loop.settings) == 2  # the runs become complete while compare-runs waits
    runner = TaskRunner(loop.settings, worker="test")
    try:
        while cli.is_alive() and time.monotonic() < deadline:
            if not runner.run_next():
                time.sleep(0.02)
    finally:
        runner.close()
    cli.join(30)
    out = capsys.readouterr()
    assert result == [0], out.err
    assert "TARGET run" in out.err and "is validating; waiting" in out.err
    lines = out.out.splitlines()
    assert lines[0] == "step 0 compared; both runs also hold step 1 (--step N compares another)"
    assert f"[forward] {GELU} (score " in out.out
    assert "step 0 compared; both runs also hold step 1" in out.err


def test_compare_runs_lists_the_worse_regression_first(
    tmp_path: Path, loop: Loop, capsys: pytest.CaptureFixture[str]
) -> None:
    """Baseline, a nightly with a small gelu drift, then one whose gelu is 40x worse: the drift is known
    in the second comparison against the baseline, yet ``compare-runs`` prints it first as ``worse``,
    with its error before and after, above the suspects."""
    for name, noise in (("base", 0.0), ("nightly-1", 0.01), ("nightly-2", 0.4)):
        write_model_dump(tmp_path / name, gelu_noise=noise)
        assert upload(tmp_path / name, name, "--wait", "0") == 0
    validate_waiting(loop.settings)
    assert main(["runs", "baseline", "base", "--project", "mlp", "--server", URL]) == 0
    compared(loop, "nightly-1")
    worse = compared(loop, "nightly-2")  # the CLI below finds this comparison and prints it
    capsys.readouterr()
    argv = ["compare-runs", "nightly-2", "base", "--project", "mlp", "--server", URL, "--wait",
            "-o", str(tmp_path / "out"), "--timeout", "60"]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("Against the baseline (since comparison ")
    verdict = lines[2].split()
    assert verdict[:2] == ["worse", f"{GELU}:"], lines
    before, after = float(verdict[2]), float(verdict[4].rstrip(";"))
    assert after > 3 * before > 0
    assert "2 worse, 0 new, 0 fixed, 0 known" in lines[1]
    assert lines[3].startswith("  worse Functional.linear.1.forward: ")
    assert lines[4].startswith("comparison ") and "Top suspects" in "\n".join(lines[5:])  # suspects after
    # The saved summary names the reports saved beside it, not the server's download names.
    out = tmp_path / "out"
    (summary,) = out.glob("compare_summary_*.json")
    (rank,) = json.loads(summary.read_text())["ranks"]
    assert (out / rank["files"]["xlsx"]).is_file() and (out / rank["files"]["advisor"]).is_file()
    assert rank["files"]["xlsx"].startswith("compare_result_")
    assert rank["files"]["advisor"].startswith("advisor_")
    # The same lines for the comparison by its id; none for one not against the baseline or not finished.
    capsys.readouterr()
    assert main(["regressions", worse, "--server", URL]) == 0
    assert capsys.readouterr().out.splitlines() == lines[1:4]
    between = compared(loop, "nightly-2", "nightly-1")
    api = loop.api()
    assert changed_lines(api, api.get_comparison(between)) == []
    assert main(["regressions", between, "--server", URL]) == 1
    assert "was not against its project's baseline" in capsys.readouterr().err
    queued = api.create_comparison(api.resolve_run("nightly-1", project="mlp").id,
                                   api.resolve_run("nightly-2", project="mlp").id)  # fmt: skip
    assert main(["regressions", queued.id, "--server", URL]) == 2
    assert f"comparison {queued.id} is queued" in capsys.readouterr().err


def test_compare_runs_without_wait_says_the_run_is_validating(
    tmp_path: Path, loop: Loop, capsys: pytest.CaptureFixture[str]
) -> None:
    two_nightlies(tmp_path)
    assert main(["compare-runs", "nightly-1", "base", "--project", "mlp", "--server", URL]) == 2
    assert "is validating, not complete (--wait waits for it)" in capsys.readouterr().err


def test_baseline_and_acceptance_by_name(
    tmp_path: Path, loop: Loop, capsys: pytest.CaptureFixture[str]
) -> None:
    two_nightlies(tmp_path)
    validate_waiting(loop.settings)
    api = loop.api()
    assert main(["runs", "baseline", "base", "--project", "mlp", "--server", URL]) == 0
    base = api.resolve_run("base", project="mlp")
    assert base.baseline
    assert f"run {base.id} (base) is the baseline of project 'mlp'" in capsys.readouterr().err
    assert main(["runs", "baseline", "nightly-1", "--server", URL]) == 0  # no --project: the name in the path
    assert api.resolve_run("nightly-1").baseline and not api.resolve_run("base").baseline  # one per project
    assert main(["runs", "baseline", "nosuch", "--server", URL]) == 2
    assert "no run with id or name 'nosuch'" in capsys.readouterr().err

    compared(loop)
    assert main(["accept", GELU, "--note", "bf16 drift, ticket 42", "--project", "mlp", "--author", "lead",
                 "--server", URL]) == 0  # fmt: skip
    assert f"{GELU} accepted in project 'mlp' by anonymous: bf16 drift, ticket 42" in capsys.readouterr().err
    (accepted,) = api.acceptances("mlp")
    assert (accepted.api, accepted.note, accepted.author) == (GELU, "bf16 drift, ticket 42", "lead")
    with pytest.raises(SystemExit):  # argparse: --note or --revoke
        main(["accept", GELU, "--server", URL])
    assert "one of the arguments --note --revoke is required" in capsys.readouterr().err


def test_an_acceptance_is_revoked_by_name(
    tmp_path: Path, loop: Loop, capsys: pytest.CaptureFixture[str]
) -> None:
    two_nightlies(tmp_path)
    validate_waiting(loop.settings)
    compared(loop)
    assert main(["accept", GELU, "--note", "bf16 drift", "--project", "mlp", "--server", URL]) == 0
    assert main(["accept", GELU, "--revoke", "--project", "mlp", "--server", URL]) == 0
    assert f"{GELU} is no longer accepted in project 'mlp'" in capsys.readouterr().err
    assert loop.api().acceptances("mlp") == []


def test_the_client_refuses_a_bad_name_before_sending(tmp_path: Path, loop: Loop, capsys) -> None:
    write_model_dump(tmp_path / "d")
    assert upload(tmp_path / "d", "  nightly 4 / x  ") == 2
    assert "--name: 'nightly 4 / x' holds a '/'" in capsys.readouterr().err
    assert loop.wire.requests == []  # nothing was asked of the server
    assert upload(tmp_path / "d", "  nightly 4  ", "--tag", " hw = cpu ", "--wait", "0") == 0
    (run,) = loop.api().find_runs(name="nightly 4")
    assert run.tags == {"hw": "cpu"}
    with pytest.raises(UploadError, match="name: holds the control character"):
        loop.api().create_run("a\x1bb")
