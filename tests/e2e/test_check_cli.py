"""``parity check``, the CI gate (issue 36), against the real app in process: a float32 baseline and three
bfloat16 nightlies compared with it on their own, the second with the same drift as the first (known), the
third with a regression on one GELU call. The check exits 0 on the second and 1 on the third, printing the
regressed GELU first, and its JUnit file holds a failing test case per new or worse API; ``parity runs
list`` and ``parity runs show`` mark the third as worse and the second as clean. The same gate on two local
dumps, judged against an earlier local check."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from parity.cli import main
from tests.e2e.app_wire import URL
from tests.e2e.conftest import Loop
from tests.server.nightly import CALLS, GELU, mlp_dump, stack_line
from tests.workers import run_waiting, validate_waiting


def run_tasks(loop: Loop) -> None:
    """Validate what waits (each completion queues its comparison against the baseline), then compare."""
    validate_waiting(loop.settings)
    run_waiting(loop.settings)


def upload(loop: Loop, root: Path, name: str) -> None:
    assert main(["upload", str(root), "--server", URL, "--name", name, "--project", "mlp", "-q",
                 "--wait", "0"]) == 0  # fmt: skip
    run_tasks(loop)


def check(name: str, *extra: str) -> list[str]:
    return ["check", name, "--project", "mlp", "--server", URL, "--timeout", "60", *extra]


def junit_cases(path: Path) -> list[tuple[str, str | None]]:
    """(test case name, its failure's type or None) in the file's order."""
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    return [(c.get("name", ""), None if c.find("failure") is None else c.find("failure").get("type"))  # type: ignore[union-attr]
            for c in suite.findall("testcase")]  # fmt: skip


@pytest.fixture
def nightlies(loop: Loop, tmp_path: Path) -> Loop:
    upload(loop, mlp_dump(tmp_path / "base"), "base")
    assert main(["runs", "baseline", "base", "--project", "mlp", "--server", URL]) == 0
    drift = mlp_dump(tmp_path / "nightly", bf16=True)
    upload(loop, drift, "nightly-1")
    upload(loop, drift, "nightly-2")
    upload(loop, mlp_dump(tmp_path / "worse", bf16=True, gelu_off=0.05, stacks=True), "nightly-3")
    return loop


def test_the_gate_passes_the_known_drift_and_fails_the_regression(
    nightlies: Loop, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    clean_xml, worse_xml = tmp_path / "nightly-2.xml", tmp_path / "nightly-3.xml"
    assert main(check("nightly-2", "--junit", str(clean_xml))) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("parity check: PASS: mlp/nightly-2 against baseline mlp/base: nothing new or "
                             f"worse (0 worse, 0 new, {len(CALLS)} known, 0 fixed"), out  # fmt: skip
    assert len(out) == 1
    assert junit_cases(clean_xml) == [(api, None) for api in CALLS]

    assert main(check("nightly-3", "--junit", str(worse_xml))) == 1
    out = capsys.readouterr().out.splitlines()
    first = out[0].split()
    assert first[:2] == ["WORSE", f"{GELU}:"], out  # the regressed call first
    before, after = float(first[2]), float(first[4].rstrip(";"))
    assert 0 < before < 0.005 and after > 0.04
    assert out[1].startswith("WORSE Functional.linear.2.forward: ")  # it carries the error on
    # Each with the line of the user's code that called it (a suspect's, or read from the stack.json).
    assert out[0].endswith(f"  at {stack_line(GELU)}") and "; max relative error " in out[0]
    assert out[1].endswith(f"  at {stack_line('Functional.linear.2.forward')}")
    assert out[-1].startswith("parity check: FAIL: mlp/nightly-3 against baseline mlp/base: something is "
                              "new or worse (2 worse, 0 new, 3 known, 0 fixed; against the previous "
                              "comparison ")  # fmt: skip
    api = nightlies.api()
    (c,) = api.list_comparisons(run=api.resolve_run("nightly-3", project="mlp").id)[0]
    assert out[-1].endswith(f"; {URL}/comparisons/{c.id}")
    root = ET.parse(worse_xml).getroot()
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == (str(len(CALLS)), "2", "0")
    cases = junit_cases(worse_xml)
    assert cases[:2] == [(GELU, "worse"), ("Functional.linear.2.forward", "worse")]
    assert {name for name, failure in cases if failure is None} == set(CALLS[:3])
    failure = ET.parse(worse_xml).getroot().find("testsuite/testcase/failure")
    assert failure is not None and f"worse: {GELU}: " in failure.get("message", "")
    assert "the previous comparison (worse beyond 3x)" in (failure.text or "")

    # The first nightly against a first comparison: every drifting API is new, and the gate says so.
    assert main(check("nightly-1")) == 1
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out[:-1]] == ["NEW"] * len(CALLS)
    assert "no earlier comparison: every failing API is new" in out[-1]


def test_every_list_says_which_run_regressed(nightlies: Loop, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["runs", "list", "--project", "mlp", "--server", URL]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["RUN", "AGAINST", "BASELINE", "STATUS"]
    by_name = {line.split()[0]: line for line in lines}
    assert by_name["mlp/nightly-3"].split()[1:4] == ["WORSE", "(2", "worse,"], by_name
    assert by_name["mlp/nightly-2"].split()[1:3] == ["clean", f"({len(CALLS)}"]
    assert by_name["mlp/nightly-1"].split()[1] == "NEW"
    assert by_name["mlp/base"].split()[1] == "baseline"
    assert "steps 0" not in by_name["mlp/base"] and " 0 " in by_name["mlp/base"]  # a list, not a count

    assert main(["runs", "show", "nightly-3", "--project", "mlp", "--server", URL]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("  against baseline: WORSE (2 worse, 3 known) (baseline base)"), out
    table = out[out.index("") + 1:]
    assert table[0].split()[:3] == ["COMPARISON", "ROLE", "OTHER"]
    assert table[1].split()[1:6] == ["target", "base", "vs", "baseline", "0"]
    assert "WORSE (2 worse, 3 known)" in table[1]


def test_the_gate_waits_for_a_run_still_validating(
    nightlies: Loop, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["upload", str(mlp_dump(tmp_path / "n4", bf16=True)), "--server", URL, "--name", "nightly-4",
                 "--project", "mlp", "-q", "--wait", "0"]) == 0  # fmt: skip
    result: list[int] = []
    cli = threading.Thread(target=lambda: result.append(main(check("nightly-4"))))
    cli.start()
    deadline = time.monotonic() + 60
    while not nightlies.wire.requests and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)  # the check is polling the validating run
    while cli.is_alive() and time.monotonic() < deadline:
        run_tasks(nightlies)
        time.sleep(0.05)
    cli.join(30)
    out = capsys.readouterr()
    assert result == [0], out
    assert "run nightly-4 is validating; waiting" in out.err
    # Against the third nightly's comparison: the drift is known; the GELU, back to the drift, still fails
    # statistics mode's thresholds: known, not fixed.
    assert out.out.splitlines()[-1].startswith("parity check: PASS: mlp/nightly-4 against baseline mlp/base")


def test_errors_exit_2_with_a_junit_error(loop: Loop, tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:  # fmt: skip
    upload(loop, mlp_dump(tmp_path / "a"), "a")
    xml = tmp_path / "e.xml"
    assert main(check("a", "--junit", str(xml))) == 2
    err = capsys.readouterr().err
    assert "project 'mlp' has no baseline: parity runs baseline NAME --project mlp sets one" in err
    root = ET.parse(xml).getroot()
    assert (root.get("tests"), root.get("errors")) == ("1", "1")
    assert main(check("a", "--baseline", "a")) == 2
    assert "is the baseline itself" in capsys.readouterr().err
    assert main(check("nosuch")) == 2
    assert main(["check", "./no/such/dump", "--baseline", "x"]) == 2
    assert "./no/such/dump: no such file or folder" in capsys.readouterr().err


def test_the_same_gate_on_two_local_dumps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = mlp_dump(tmp_path / "base") / "step0" / "rank0"
    drift = mlp_dump(tmp_path / "nightly", bf16=True) / "step0" / "rank0"
    worse = mlp_dump(tmp_path / "worse", bf16=True, gelu_off=0.05) / "step0" / "rank0"
    first, second, third = (tmp_path / f"out{k}" for k in (1, 2, 3))
    assert main(["check", str(drift), "--baseline", str(base), "-o", str(first)]) == 1  # no history: new
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[:-1]] == ["NEW"] * len(CALLS)
    previous = first / "check_summary.json"
    assert main(["check", str(drift), "--baseline", str(base), "-o", str(second),
                 "--previous", str(previous)]) == 0  # fmt: skip
    assert "PASS" in capsys.readouterr().out
    xml = tmp_path / "local.xml"
    assert main(["check", str(worse), "--baseline", str(base / "dump.json"), "-o", str(third),
                 "--previous", str(second / "check_summary.json"), "--junit", str(xml)]) == 1  # fmt: skip
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["WORSE", f"{GELU}:"], out
    assert junit_cases(xml)[0] == (GELU, "worse")
    assert list(third.glob("compare_result_*.xlsx"))
    (compare_summary,) = third.glob("compare_summary_*.json")
    unused = tmp_path / "unused"
    assert main(["check", str(worse), "--baseline", str(base), "--previous", str(compare_summary),
                 "-o", str(unused)]) == 2  # fmt: skip
    assert "not a check_summary.json of parity check" in capsys.readouterr().err
    assert main(["check", str(worse), "--baseline", str(base), "--previous", str(xml),
                 "-o", str(unused)]) == 2  # fmt: skip
    assert f"--previous {xml}: cannot read it" in capsys.readouterr().err
    assert not unused.exists()  # refused before any compare ran
    # A local dump of a step cut short: compared, with a warning naming it.
    from parity.shared.incomplete import mark_incomplete

    mark_incomplete(drift, step=0, rank=0, reason="the process raised KeyError: 'x' before step()")
    assert main(["check", str(drift), "--baseline", str(base), "-o", str(tmp_path / "out4")]) == 1
    err = capsys.readouterr().err
    assert (f"parity check: warning: the target dump {drift / 'dump.json'} is of a step cut short (the "
            "process raised KeyError: 'x' before step()): compared as it is, not as a whole step") in err


def test_a_step_cut_short_is_checked_with_a_warning(
    nightlies: Loop, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A nightly whose step the client marked incomplete (it raised before ``step()``): the server says so
    on the run and its comparison's page, and the gate judges it with a warning, never as a whole step."""
    from parity.shared.incomplete import mark_incomplete

    root = mlp_dump(tmp_path / "cut", bf16=True)
    mark_incomplete(root / "step0" / "rank0", step=0, rank=0,
                    reason="the process raised KeyError: 'x' before step()")
    upload(nightlies, root, "nightly-cut")
    api = nightlies.api()
    run = api.resolve_run("nightly-cut", project="mlp")
    assert run.incomplete == ["step0/rank0"]
    xml = tmp_path / "cut.xml"
    assert main(check("nightly-cut", "--junit", str(xml))) == 0
    err = capsys.readouterr().err
    assert ("parity check: warning: the target run nightly-cut's step0/rank0 is of a step cut short (the "
            "process raised or died before step()): compared as it is, not as a whole step") in err
    suite = ET.parse(xml).getroot().find("testsuite")
    assert suite is not None and "step cut short" in (suite.findtext("system-err") or "")
    (c,) = api.list_comparisons(run=run.id)[0]
    page = nightlies.wire.app.get(f"/comparisons/{c.id}")
    assert page.status_code == 200 and 'id="incomplete-target"' in page.text
    assert 'id="run-incomplete"' in nightlies.wire.app.get(f"/runs/{run.id}").text


def test_the_first_nightlys_drift_is_accepted_in_one_command(
    loop: Loop, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upload(loop, mlp_dump(tmp_path / "base"), "base")
    assert main(["runs", "baseline", "base", "--project", "mlp", "--server", URL]) == 0
    upload(loop, mlp_dump(tmp_path / "nightly", bf16=True), "nightly-1")
    assert main(check("nightly-1")) == 1  # every drifting API is new
    api = loop.api()
    (c,) = api.list_comparisons(run=api.resolve_run("nightly-1", project="mlp").id)[0]
    capsys.readouterr()
    accept = ["accept", "--project", "mlp", "--server", URL]
    assert main([*accept, "--new-in", c.id, "--note", "bf16 drift"]) == 0
    assert capsys.readouterr().err.count("accepted in project 'mlp' by anonymous: bf16 drift") == len(CALLS)
    assert main(check("nightly-1")) == 0
    assert main(["accept", *CALLS[:2], "--revoke", "--project", "mlp", "--server", URL]) == 0
    assert capsys.readouterr().err.count("is no longer accepted") == 2
    assert sorted(a.api for a in api.acceptances("mlp")) == sorted(CALLS[2:])
    assert main(["accept", "--note", "x", "--project", "mlp", "--server", URL]) == 2
    assert "name the APIs to accept" in capsys.readouterr().err


def test_plan_reads_the_summary_compare_runs_saved(
    nightlies: Loop, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``parity plan`` on the summary ``compare-runs --wait`` saved asks the server that compared the runs
    (which holds the dumps its neighbours are read from, the level and the step), instead of failing on
    "--neighbours needs the target dump.json" or writing level L1 and step []."""
    import json

    out = tmp_path / "out"
    assert main(["compare-runs", "nightly-3", "base", "--project", "mlp", "--server", URL, "--wait",
                 "-o", str(out)]) == 0  # fmt: skip
    (summary,) = out.glob("compare_summary_*.json")
    saved = json.loads(summary.read_text())
    assert saved["server"] == URL and saved["comparison"]
    config = tmp_path / "config.json"
    assert main(["plan", str(summary), "-o", str(config)]) == 0, capsys.readouterr().err
    plan = json.loads(config.read_text())
    assert plan["step"] == [0] and plan["task"] == "tensor" and GELU in plan["tensor"]["list"]
    # One saved before it named its comparison: the way to plan it, in one line.
    del saved["comparison"], saved["server"]
    summary.write_text(json.dumps(saved))
    capsys.readouterr()
    assert main(["plan", str(summary), "-o", str(config)]) == 2
    assert "a server's summary (its dumps are on the server" in capsys.readouterr().err
