"""The float64 replay's budget (issue 37): crafted dumps of a few KB (``tests/replay_probes.py``) that asked
for minutes of CPU, gigabytes of memory or a native crash are refused before they run, by the cost rule of
each API (``replay.cost``), or lose only their own verdict in the replay's child process
(``replay.sandbox``: memory and CPU capped, a crash contained); the replays of real dumps are unchanged."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from parity.shared.replay import cost
from parity.shared.replay.apis import ALLOWED, ReplayRefusal
from parity.shared.replay.engine import Verdict, replay_calls
from parity.shared.replay.sandbox import ReplayBudget, WarmChild, replay_isolated
from parity.shared.replay.verdicts import ReplayVerdict

from tests.replay_dumps import GELU, dump_model, wrong_forward_gelu
from tests.replay_probes import PROBES, ProbeDump, expanded, write_probes

#: What each probe's verdict says (after "not replayed: ").
REFUSED = {
    "max_pool1d": "over budget: its replay would take 2.7e+11 operations (aten.max_pool2d_with_indices: "
                  "2.7e+11)",
    "cdist_p3": "over budget: its replay would take 1.0e+11 operations (aten._cdist_forward: 1.0e+11)",
    "nuclear_norm": "over budget: its replay would take 1.0e+11 operations (aten._linalg_svd: 1.0e+11)",
    "bilinear": "over budget: its replay would take 1.4e+11 operations (aten._trilinear: 1.4e+11)",
    "einsum": "over budget: its replay would hold an intermediate of 400000000 elements (aten.mul), over the "
              "cap of 67108864",
    "masked_index": "over budget: its replay would produce 4294967296 elements, over the cap of 67108864",
    "unbind": "over budget: its replay would make 1048576 tensors, over the cap of 16384",
    "layer_norm_empty_grad": "backward input 0: the recorded gradient has shape [0], the call's output 0 has "
                             "[4, 8]: not handed to the kernel",
    "batch_norm_empty_grad": "backward input 0: the recorded gradient has shape [0], the call's output 0 has "
                             "[4, 3]: not handed to the kernel",
    "cdist_empty_grad": "backward input 0: the recorded gradient has shape [0], the call's output 0 has "
                        "[5, 6]: not handed to the kernel",
}  # fmt: skip
CRASH_CHILD = [sys.executable, "-m", "tests.replay_crash_child"]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("budget")
    return {"bench": dump_model(root / "bench"),
            "target": dump_model(root / "target", gelu=wrong_forward_gelu())}  # fmt: skip


def test_every_crafted_probe_is_refused_before_it_runs_in_the_child(tmp_path: Path) -> None:
    """One child for all: each probe's verdict is its refusal, none holds the process (the CPU cap would
    end a probe that ran as a "took more than 20 s" verdict instead, and the test would say so)."""
    assert set(REFUSED) == set(PROBES)
    dump, entries = write_probes(tmp_path / "rank0")
    verdicts = replay_isolated(dump, dump, list(entries.values()), budget=ReplayBudget(call_seconds=20))
    for (name, entry), v in zip(entries.items(), verdicts, strict=True):
        assert v.entry == entry and v.verdict is Verdict.NOT_REPLAYED, (name, v.text)
        assert v.text.startswith(f"not replayed: {REFUSED[name]}"), (name, v.text)


def test_real_dumps_replay_the_same_in_the_child_as_in_process(dumps: dict[str, Path]) -> None:
    import json

    names = list(json.loads(dumps["bench"].read_text())["data"])
    here = replay_calls(dumps["target"], dumps["bench"], names)
    there = replay_isolated(dumps["target"], dumps["bench"], names, budget=ReplayBudget())

    def outcome(v: ReplayVerdict) -> tuple[object, ...]:  # the distances' last digits: one thread, not N
        sides = (v.target, v.bench)
        return (v.entry, v.verdict, *(s.refusal for s in sides), *(s.allowance for s in sides),
                *(s.distance is not None and round(math.log10(max(s.distance, 1e-300)), 1) for s in sides))

    assert [outcome(v) for v in there] == [outcome(v) for v in here]
    assert next(v for v in there if v.entry == GELU).verdict is Verdict.TARGET


def test_the_asked_and_identical_replays_come_back_from_the_child(tmp_path: Path) -> None:
    """The target asked for ``approximate='tanh'``: its inputs replayed with the bench's arguments give the
    bench's output, in the child as in process (the verdict ``arguments``, its ``asked`` side carried)."""
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    entry = "Functional.gelu.0.forward"
    target, bench = ProbeDump(), ProbeDump()
    gelu = torch.nn.functional.gelu
    target.forward(entry, [x], {"approximate": "tanh"}, output=gelu(x, approximate="tanh"))
    bench.forward(entry, [x], output=gelu(x))
    target_dump, bench_dump = target.write(tmp_path / "target"), bench.write(tmp_path / "bench")
    requests = {"asked": {entry: "approximate: 'tanh' vs not passed"}, "identical": [entry]}
    here = replay_calls(target_dump, bench_dump, [entry], **requests)  # type: ignore[arg-type]
    (there,) = replay_isolated(target_dump, bench_dump, [entry], budget=ReplayBudget(), **requests)
    assert here[0].verdict is Verdict.ARGUMENTS, here[0].text
    assert there.verdict is Verdict.ARGUMENTS and there.text == here[0].text
    assert there.asked is not None and there.asked.distance == here[0].asked.distance  # type: ignore[union-attr]
    assert there.identical and there.arguments == "approximate: 'tanh' vs not passed"


def test_a_crash_loses_only_its_own_verdict(dumps: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A SIGSEGV in the middle: that call is "not replayed: the replay crashed", the calls before and after
    it keep their verdicts (a new child replays the rest)."""
    monkeypatch.setenv("PARITY_TEST_CRASH_ON", "Functional.layer_norm.0.forward")
    names = ["Functional.linear.0.forward", "Functional.layer_norm.0.forward", GELU]
    first, crashed, gelu = replay_isolated(dumps["target"], dumps["bench"], names, budget=ReplayBudget(),
                                           argv=CRASH_CHILD)  # fmt: skip
    assert first.verdict is Verdict.NEITHER, first.text
    assert crashed.verdict is Verdict.NOT_REPLAYED
    assert crashed.text == ("not replayed: the replay crashed its process (SIGSEGV, in torch's native code); "
                            "only this call's verdict is lost")  # fmt: skip
    assert gelu.verdict is Verdict.TARGET, gelu.text


def _slow_matmuls(rank_dir: Path, count: int) -> tuple[Path, list[str]]:
    """Calls within the cost rules that still take seconds of float64 CPU: 6e10 operations each."""
    probe = ProbeDump()
    names = [f"Torch.matmul.{k}.forward" for k in range(count)]
    for name in names:
        probe.forward(name, [expanded(2048, 4096), expanded(4096, 3584)])
    return probe.write(rank_dir), names


def test_a_call_past_its_cpu_time_is_stopped_and_the_next_one_runs(tmp_path: Path) -> None:
    dump, (slow,) = _slow_matmuls(tmp_path / "slow", 1)
    probe = ProbeDump()
    probe.forward("Torch.add.0.forward", [torch.ones(3), torch.ones(3)], output=torch.full((3,), 2.0))
    quick = probe.write(tmp_path / "quick")
    (v,) = replay_isolated(dump, dump, [slow], budget=ReplayBudget(call_seconds=1))
    assert v.text == "not replayed: over budget: its replay took more than 1 s of CPU time", v.text
    assert replay_isolated(quick, quick, ["Torch.add.0.forward"], budget=ReplayBudget(call_seconds=1)
                           )[0].verdict is Verdict.NEITHER  # fmt: skip


def test_the_compares_cpu_time_is_shared_by_its_calls(tmp_path: Path) -> None:
    """Six calls of about a second or more each (a fast core may finish one), two seconds for all: the
    calls once they are spent are not replayed, and say why."""
    dump, names = _slow_matmuls(tmp_path / "rank0", 6)
    verdicts = replay_isolated(dump, dump, names, budget=ReplayBudget(call_seconds=30, total_seconds=2))
    spent = "not replayed: over budget: the compare's 2 s of replay CPU time are spent"
    texts = [v.text for v in verdicts]
    first = texts.index(spent)
    assert first <= 2 and texts[first:] == [spent] * (len(names) - first), texts
    assert all("over budget" not in t for t in texts[:first]), texts


def test_memory_past_the_cap_is_over_budget_for_that_call_only(tmp_path: Path) -> None:
    """64 MiB of address space: a call whose float64 tensors take 64 MB cannot allocate them."""
    probe = ProbeDump()
    probe.forward("Torch.exp.0.forward", [expanded(4096, 2048)])
    probe.forward("Torch.add.0.forward", [torch.ones(3), torch.ones(3)], output=torch.full((3,), 2.0))
    dump = probe.write(tmp_path / "rank0")
    big, small = replay_isolated(dump, dump, ["Torch.exp.0.forward", "Torch.add.0.forward"],
                                 budget=ReplayBudget(memory_bytes=64 * 2**20))  # fmt: skip
    expected = "over budget: its replay needs more than the replay's 0.0625 GiB of memory"
    assert big.text == f"not replayed: {expected}", big.text
    assert small.verdict is Verdict.NEITHER, small.text


def test_every_allowed_api_has_a_cost_rule() -> None:
    assert {name for table in ALLOWED.values() for name in table} <= set(cost.API_RULES)
    with pytest.raises(ReplayRefusal, match="^no cost bound: frobnicate has no cost rule$"):
        cost.check_arguments("frobnicate", [], {})


def test_an_aten_operation_without_a_rule_is_no_cost_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.ones(5, 3)
    _, trace = cost.trace_forward(torch.cdist, "cdist", [x, x], {"p": 3.0})
    trace.check(2**26, 2**36)  # with its rule
    monkeypatch.delitem(cost.ATEN_RULES, torch.ops.aten._cdist_forward)
    _, trace = cost.trace_forward(torch.cdist, "cdist", [x, x], {"p": 3.0})
    with pytest.raises(ReplayRefusal, match="^no cost bound: its replay runs aten._cdist_forward, which has"):
        trace.check(2**26, 2**36)


def test_a_bool_mask_index_is_bounded_by_its_true_elements() -> None:
    x = torch.ones(4, 8)
    mask = torch.tensor([True, False, True, False])
    out, trace = cost.trace_forward(torch.Tensor.__getitem__, "__getitem__", [x, mask], {})
    assert out.shape == x[mask].shape == (2, 8)
    index = (mask, torch.tensor([1, 2]))
    out, _ = cost.trace_forward(torch.Tensor.__getitem__, "__getitem__", [x, index], {})
    assert out.shape == x[mask, torch.tensor([1, 2])].shape


def test_a_child_started_ahead_replays_as_a_fresh_one_and_an_unused_one_is_reaped(
        dumps: dict[str, Path]) -> None:  # fmt: skip
    """``WarmChild`` (torch imported before the request comes, issue 39): the same verdicts as a child
    started for the request; taken once; one never used is killed and reaped."""
    names = ["Functional.linear.0.forward", GELU]
    fresh = replay_isolated(dumps["target"], dumps["bench"], names, budget=ReplayBudget())
    with WarmChild() as warm:
        ahead = replay_isolated(dumps["target"], dumps["bench"], names, budget=ReplayBudget(), warm=warm)
        assert warm.take() is None
    assert [v.as_dict() for v in ahead] == [v.as_dict() for v in fresh]
    unused = WarmChild()
    assert unused._child is not None
    proc = unused._child.proc
    unused.close()
    assert proc.returncode is not None and unused.take() is None


def test_the_cli_pipeline_writes_what_the_sequential_steps_write(dumps: dict[str, Path],
                                                                  tmp_path: Path) -> None:  # fmt: skip
    """``run_compare`` with the sandbox starts its child while the table is built and writes the table while
    the replay runs: its table and advisor are byte for byte those of the steps run one after another."""
    from parity.shared.compare.engine import compare_dumps
    from parity.shared.compare.job import run_compare
    from parity.shared.compare.options import CompareOptions
    from parity.shared.compare.spec import load_compare_spec
    from parity.shared.report.advisor import write_advisor
    from parity.shared.report.xlsx import write_xlsx

    from tests.replay_dumps import write_compare_json

    options = CompareOptions(replay_budget=ReplayBudget())
    spec = write_compare_json(tmp_path / "compare.json", dumps["target"], dumps["bench"])
    outputs = run_compare(load_compare_spec(spec), tmp_path / "out", options, timestamp="20261207000000")
    result = compare_dumps(dumps["target"], dumps["bench"], options)
    write_xlsx(result, tmp_path / "table.xlsx")
    write_advisor(result, tmp_path / "advisor.txt")
    assert result.replay is not None and result.replay["verdicts"]
    assert _workbook(outputs.xlsx[0]) == _workbook(tmp_path / "table.xlsx")
    assert outputs.advisors[0].read_text() == (tmp_path / "advisor.txt").read_text()


def _workbook(path: Path) -> dict[str, bytes]:
    """Every part of an xlsx but its creation time (docProps/core.xml)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist() if n != "docProps/core.xml"}
