"""Alignment (issue 24): calls paired by aligning the two sequences, gaps judged as one call, ``-dm``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from parity.shared.compare.alignment import align_rows, pair_calls
from parity.shared.compare.engine import call_modules, compare_dumps, compare_part
from parity.shared.compare.localization import _modules_round_as_their_calls
from parity.shared.compare.mapping import load_data_mapping, parse_data_mapping
from parity.shared.compare.module_scopes import pair_modules, split_by_scope
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import CompareResult, RowStatus
from parity.shared.compare.rows import side_rows
from parity.shared.dump.reader import load_construct, load_dump
from parity.shared.errors import CompareInputError
from parity.shared.replay.engine import GAP_REFUSAL
from parity.shared.report.advisor import suspect_lines

from tests.factories import DumpBuilder
from tests.gap_dumps import SDPA, fused_pair

pytest.importorskip("parity.shared.metrics.parallel")  # tensor mode needs the metric workers

Call = tuple[str, list[Any], list[Any]]


def _t(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _write(tmp_path: Path, side: str, calls: list[Call], task: str = "tensor") -> Path:
    builder = DumpBuilder(task)
    for name, inputs, outputs in calls:
        builder.api(name, inputs=inputs, outputs=outputs)
    return builder.write(tmp_path / side)


def _pairs(tmp_path: Path, target: list[Call], bench: list[Call]) -> dict[str, str | None]:
    """Each target row's bench row (None: unpaired), by name, as the alignment pairs them."""
    npu = side_rows(load_dump(_write(tmp_path, "npu", target)), tensor_mode=True)
    ref = side_rows(load_dump(_write(tmp_path, "bench", bench)), tensor_mode=True)
    pairing, _ = align_rows(npu, ref)
    index = pairing.bench_index
    return {name: (ref.names[j] if j >= 0 else None) for name, j in zip(npu.names, index, strict=True)}


def _col(result: CompareResult, column: str) -> list[Any]:
    k = result.header.index(column)
    return [row.cells[k] for row in result.rows]


def test_identical_traces_take_the_name_path(tmp_path: Path) -> None:
    x = _t(4)
    calls: list[Call] = [("Torch.add.0.forward", [x], [x + 1]), ("Torch.mul.0.forward", [x + 1], [x * 2])]
    npu = side_rows(load_dump(_write(tmp_path, "npu", calls)), tensor_mode=True)
    ref = side_rows(load_dump(_write(tmp_path, "bench", calls)), tensor_mode=True)
    pairing, aligned = pair_calls(npu, ref)
    assert aligned is None and pairing.bench_index == list(range(len(npu)))


def test_shifted_counters_pair_with_the_right_partner(tmp_path: Path) -> None:
    """One extra add on the target shifts every later add's counter: the later adds still pair with the
    bench's calls that did the same work, not with the bench's calls of the same number."""
    a, b, c = _t(4, seed=1), _t(3, seed=2), _t(5, seed=3)
    target: list[Call] = [
        ("Torch.add.0.forward", [a], [a + 1]),
        ("Torch.add.1.forward", [b], [b + 1]),  # the extra call
        ("Torch.add.2.forward", [c], [c + 1]),
        ("Torch.add.3.forward", [a], [a + 2]),
    ]
    bench: list[Call] = [
        ("Torch.add.0.forward", [a], [a + 1]),
        ("Torch.add.1.forward", [c], [c + 1]),
        ("Torch.add.2.forward", [a], [a + 2]),
    ]
    pairs = _pairs(tmp_path, target, bench)
    assert pairs["Torch.add.2.forward.output.0"] == "Torch.add.1.forward.output.0"
    assert pairs["Torch.add.3.forward.output.0"] == "Torch.add.2.forward.output.0"
    assert pairs["Torch.add.0.forward.input.0"] == "Torch.add.0.forward.input.0"


def _chain(prefix: list[Call], x: torch.Tensor) -> list[Call]:
    return [*prefix, ("Torch.relu.0.forward", [x], [x.relu()]), ("Torch.exp.0.forward", [x], [x.exp()])]


def test_a_gap_on_each_side(tmp_path: Path) -> None:
    """A call only the target makes, then one only the bench makes: each is a gap, every other call pairs."""
    x, y = _t(6, seed=4), _t(2, 3, seed=5)
    target: list[Call] = [("Torch.sin.0.forward", [x], [x.sin()]), ("Torch.cos.0.forward", [y], [y.cos()]),
                          ("Torch.tanh.0.forward", [x], [x.tanh()]), ("Torch.abs.0.forward", [x], [x.abs()])]
    bench: list[Call] = [("Torch.sin.0.forward", [x], [x.sin()]), ("Torch.tanh.0.forward", [x], [x.tanh()]),
                         ("Torch.neg.0.forward", [y], [-y]), ("Torch.abs.0.forward", [x], [x.abs()])]
    npu = side_rows(load_dump(_write(tmp_path, "npu", target)), tensor_mode=True)
    ref = side_rows(load_dump(_write(tmp_path, "bench", bench)), tensor_mode=True)
    pairing, aligned = align_rows(npu, ref)
    assert [(g.target, g.bench) for g in aligned.gaps] == [
        (("Torch.cos.0.forward",), ()), ((), ("Torch.neg.0.forward",))]
    by_name = dict(zip(npu.names, pairing.bench_index, strict=True))
    assert ref.names[by_name["Torch.abs.0.forward.output.0"]] == "Torch.abs.0.forward.output.0"
    assert by_name["Torch.cos.0.forward.output.0"] == -1  # nothing on the bench holds its value
    assert [ref.names[j] for j in pairing.bench_only] == ["Torch.neg.0.forward.input.0",
                                                           "Torch.neg.0.forward.output.0"]


def test_gaps_at_the_start_and_at_the_end(tmp_path: Path) -> None:
    x = _t(5, seed=6)
    target: list[Call] = [("Torch.ones.0.forward", [3], [torch.ones(3)]),
                          ("Torch.sin.0.forward", [x], [x.sin()]), ("Torch.cos.0.forward", [x], [x.cos()])]
    bench: list[Call] = [("Torch.sin.0.forward", [x], [x.sin()]), ("Torch.cos.0.forward", [x], [x.cos()]),
                         ("Torch.zeros.0.forward", [2], [torch.zeros(2)])]
    npu = side_rows(load_dump(_write(tmp_path, "npu", target)), tensor_mode=True)
    ref = side_rows(load_dump(_write(tmp_path, "bench", bench)), tensor_mode=True)
    pairing, aligned = align_rows(npu, ref)
    assert [g.label for g in aligned.gaps] == ["target Torch.ones.0.forward ~ bench (no call)",
                                               "target (no call) ~ bench Torch.zeros.0.forward"]
    by_name = dict(zip(npu.names, pairing.bench_index, strict=True))
    assert ref.names[by_name["Torch.sin.0.forward.output.0"]] == "Torch.sin.0.forward.output.0"
    assert ref.names[by_name["Torch.cos.0.forward.input.0"]] == "Torch.cos.0.forward.input.0"


# ------------------------------------------------------------------------------------------------------
# a fused call against its explicit form: the gap judged as one call


def test_fused_call_against_explicit_calls_is_one_gap(tmp_path: Path) -> None:
    npu, bench = fused_pair(tmp_path / "npu", tmp_path / "bench", fault=False)
    result = compare_dumps(npu, bench, CompareOptions(replay_top=0))
    gaps = {g for g in _col(result, "Parity Gap") if g}
    assert gaps == {
        "target Functional.scaled_dot_product_attention.0.forward ~ bench Tensor.transpose.0.forward ... "
        "Torch.matmul.1.forward",
        "target Functional.scaled_dot_product_attention.1.forward ~ bench Tensor.transpose.1.forward ... "
        "Torch.matmul.3.forward",
    }
    names, bench_names = _col(result, "NPU Name"), _col(result, "Bench Name")
    pairing = dict(zip(names, zip(bench_names, _col(result, "Parity Pairing"), strict=True), strict=True))
    # the fused call's boundary tensors pair with the explicit calls' boundary tensors
    sdpa = "Functional.scaled_dot_product_attention.1.forward"
    assert pairing[f"{sdpa}.input.0"] == ("Torch.matmul.2.forward.input.0", "gap")
    assert pairing[f"{sdpa}.input.1"] == ("Tensor.transpose.1.forward.input.0", "gap")
    assert pairing[f"{sdpa}.input.2"] == ("Torch.matmul.3.forward.input.1", "gap")
    assert pairing[f"{sdpa}.output.0"] == ("Torch.matmul.3.forward.output.0", "gap")
    assert pairing["Torch.tanh.1.forward.output.0"] == ("Torch.tanh.1.forward.output.0", "name")
    # the bench's internal rows are reported, in the gap
    inner = [r for r in result.rows if r.status is RowStatus.BENCH_ONLY]
    assert {r.cells[1] for r in inner} >= {"Functional.softmax.1.forward.output.0"}
    # rounding only (fp32 fused vs explicit): no suspect
    assert result.suspects == []


def test_a_faulty_fused_call_is_the_top_suspect_as_a_gap(tmp_path: Path) -> None:
    npu, bench = fused_pair(tmp_path / "npu", tmp_path / "bench", fault=True)
    result = compare_dumps(npu, bench, CompareOptions())
    top = result.suspects[0]
    assert top.api == "Functional.scaled_dot_product_attention.1.forward"
    assert top.gap is not None and top.gap.startswith("target Functional.scaled_dot_product_attention.1")
    assert top.reason.startswith("calls without a partner, judged as one on the tensors crossing them")
    assert all(s.api != "Functional.scaled_dot_product_attention.0.forward" for s in result.suspects)
    # the float64 replay takes the gap's target side only: the bench computes it as other calls
    assert result.replay is not None
    verdicts = result.replay["verdicts"]
    assert isinstance(verdicts, list)
    gap = next(v for v in verdicts if v["entry"] == top.api)
    assert gap["bench"]["refusal"] == GAP_REFUSAL


# ------------------------------------------------------------------------------------------------------
# -dm


def test_data_mapping_overrides_the_alignment(tmp_path: Path) -> None:
    x, y = _t(4, seed=9), _t(4, seed=10)
    npu = _write(tmp_path, "npu", [("Torch.sin.0.forward", [x], [x.sin()]),
                                   ("Torch.cos.0.forward", [y], [y.cos()])])
    bench = _write(tmp_path, "bench", [("Torch.sin.0.forward", [x], [x.sin()]),
                                       ("Torch.special_cos.0.forward", [y], [y.cos()])])
    plain = compare_dumps(npu, bench, CompareOptions(replay_top=0))
    # a two-sided gap: its boundary tensors pair by shape and values
    assert _col(plain, "Parity Pairing")[2:4] == ["gap", "gap"]
    mapping_file = tmp_path / "data_mapping.yaml"
    mapping_file.write_text("Torch.cos.0.forward: Torch.special_cos.0.forward\n"
                            "Torch.sin.0.forward.output.0: Torch.special_cos.0.forward.output.0\n")
    options = CompareOptions(replay_top=0, data_mapping=load_data_mapping(mapping_file))
    mapped = compare_dumps(npu, bench, options)
    assert _col(mapped, "Bench Name")[1:4] == ["Torch.special_cos.0.forward.output.0",
                                              "Torch.special_cos.0.forward.input.0",
                                              "Torch.special_cos.0.forward.output.0"]
    assert _col(mapped, "Parity Pairing")[:4] == ["name", "mapped", "mapped", "mapped"]
    assert mapped.rows[3].status is RowStatus.PASS
    assert mapped.rows[1].status is RowStatus.FAIL  # sin(x) against cos(y), as the file says


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: [b\n", "not valid YAML at line"),
        ("- a\n- b\n", "must be a YAML mapping"),
        ("", "got empty"),
        ("Torch.sin.0.forward: 3\n",
         "entry 'Torch.sin.0.forward': the bench name must be a non-empty string, got 3"),
        # issue 37: a few hundred bytes of aliases of aliases, refused before they are built or echoed
        ("a: &a [x, x, x, x, x, x, x, x, x, x]\n"
         + "".join(f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n"
           for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
         "expands to more than 1,000,000 values"),
        ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b]\n",
         "entry 'a': the bench name must be a non-empty string, got a list of 10 items"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "nested deeper than 64 levels"),
    ],
)
def test_bad_mapping_files_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "data_mapping.yaml"
    path.write_text(text)
    with pytest.raises(CompareInputError, match=str(path)) as info:
        load_data_mapping(path)
    assert message in str(info.value) and len(str(info.value)) < 300 + len(str(path))


def test_mapping_names_must_exist(tmp_path: Path) -> None:
    x = _t(4, seed=11)
    npu = _write(tmp_path, "npu", [("Torch.sin.0.forward", [x], [x.sin()])])
    bench = _write(tmp_path, "bench", [("Torch.sin.0.forward", [x], [x.sin()])])
    nope = "Torch.nope.0.forward"
    for doc, wrong in (({nope: "Torch.sin.0.forward"}, f"'{nope}' is no row"),
                       ({"Torch.sin.0.forward": nope}, f"'{nope}' is no call"),
                       ({"b" * 10**6: "x"}, "... (1,000,000 characters)' is no row")):  # not echoed whole
        options = CompareOptions(replay_top=0, data_mapping=parse_data_mapping(doc, source="dm.yaml"))
        with pytest.raises(CompareInputError, match="dm.yaml: entry") as info:
            compare_dumps(npu, bench, options)
        assert wrong in str(info.value) and len(str(info.value)) < 500


def test_the_part_names_the_bench_partner_of_a_renamed_call_and_of_a_gap(tmp_path: Path) -> None:
    """What the float64 replay must not take by name: a call paired under another name, a gap's call."""
    a, c = _t(4, seed=12), _t(5, seed=13)
    npu = _write(tmp_path, "npu", [("Torch.add.0.forward", [a], [a + 1]),
                                   ("Torch.exp.0.forward", [c], [c.exp()]),
                                   ("Torch.add.1.forward", [c], [c + 1])])
    bench = _write(tmp_path, "bench", [("Torch.add.0.forward", [a], [a + 1]),
                                       ("Torch.add.1.forward", [a], [a]),
                                       ("Torch.add.2.forward", [c], [c + 1])])
    part = compare_part(npu, bench, CompareOptions(replay_top=0))
    assert part.partners == {"Torch.add.1.forward": "Torch.add.2.forward", "Torch.exp.0.forward": ""}
    assert part.gaps == {"Torch.exp.0.forward": "target Torch.exp.0.forward ~ bench Torch.add.1.forward"}


def test_the_advisor_names_a_gap_by_its_two_sides(tmp_path: Path) -> None:
    npu, bench = fused_pair(tmp_path / "npu", tmp_path / "bench", fault=True)
    result = compare_dumps(npu, bench, CompareOptions(replay_top=0))
    lines = suspect_lines(result.suspects, result.first_divergence)
    gap = f"gap target {SDPA}.1.forward ~ bench Tensor.transpose.1.forward ... Torch.matmul.3.forward"
    assert lines[0] == f"First divergence: [forward] {gap} (Excel row {result.suspects[0].excel_row})"
    assert any(line.startswith(f"1. [forward] {gap} (score ") for line in lines)


def test_a_module_rounds_at_least_as_the_calls_inside_it() -> None:
    """At mix a module wraps a fused call: it may differ by what that call's reductions round."""
    apis = ["Functional.scaled_dot_product_attention.0.forward", "Module.attn.Attention.forward.0",
            "Module.block.Block.forward.0", "Torch.add.0.forward"]
    own = np.array([1e-6, 6e-8, 6e-8, 6e-8])
    parents = {apis[0]: apis[1], apis[1]: apis[2]}
    _modules_round_as_their_calls(apis, own, parents)
    assert own.tolist() == [1e-6, 1e-6, 1e-6, 6e-8]


def test_the_part_carries_each_calls_modules_from_construct_json(tmp_path: Path) -> None:
    x = _t(4, seed=14)
    paths = []
    for side in ("npu", "bench"):
        builder = DumpBuilder("tensor", level="mix")
        builder.api("Torch.sin.0.forward", inputs=[x], outputs=[x.sin()])
        builder.api("Module.m.M.forward.0", inputs=[x], outputs=[x.sin()])
        builder.construct = {"Torch.sin.0.forward": "Module.m.M.forward.0", "Module.m.M.forward.0": None}
        paths.append(builder.write(tmp_path / side))
    part = compare_part(paths[0], paths[1], CompareOptions(replay_top=0))
    assert part.parents == {"Torch.sin.0.forward": "Module.m.M.forward.0"}
    (tmp_path / "npu" / "construct.json").write_text("[")  # broken: a hint lost, never a failed compare
    assert compare_part(paths[0], paths[1], CompareOptions(replay_top=0)).parents == {}


# ------------------------------------------------------------------------------------------------------
# module scopes (construct.json): a call pairs only inside its module's partner


def _module_pair(tmp_path: Path, *, construct: bool = True) -> tuple[Path, Path]:
    """Modules ``a`` then ``b``: the target makes an extra ``exp`` at the end of ``a``, the bench one at the
    start of ``b`` (each module has a call the other side's lacks). ``b``'s output differs (the fault)."""
    x = _t(6, seed=20)
    y = x.sin().cos()
    a, b = "Module.a.A.forward.0", "Module.b.B.forward.0"
    common = [(a, [x], [y]), ("Torch.sin.0.forward", [x], [x.sin()]), ("Torch.cos.0.forward", [x.sin()], [y])]
    exp = ("Torch.exp.0.forward", [x], [x.exp()])
    tanh = ("Torch.tanh.0.forward", [y], [y.tanh()])
    sides = {"npu": [*common, exp, (b, [y], [y.tanh() * 1.5]), tanh,
                     ("Torch.mul.0.forward", [y.tanh()], [y.tanh() * 1.5])],
             "bench": [*common, (b, [y], [y.tanh()]), exp, tanh,
                       ("Torch.mul.0.forward", [y.tanh()], [y.tanh()])]}
    inside = {"npu": {"Torch.exp.0.forward": a}, "bench": {"Torch.exp.0.forward": b}}
    paths = []
    for side, calls in sides.items():
        builder = DumpBuilder("tensor", level="mix" if construct else "L1")
        for name, inputs, outputs in calls:
            builder.api(name, inputs=inputs, outputs=outputs)
        builder.construct = ({a: None, b: None, "Torch.sin.0.forward": a, "Torch.cos.0.forward": a,
                              "Torch.tanh.0.forward": b, "Torch.mul.0.forward": b, **inside[side]}
                             if construct else {})  # fmt: skip
        paths.append(builder.write(tmp_path / side))
    return paths[0], paths[1]


def _gaps_of(npu_json: Path, bench_json: Path, modules: Any) -> tuple[list[str], dict[str, str | None]]:
    npu = side_rows(load_dump(npu_json), tensor_mode=True)
    ref = side_rows(load_dump(bench_json), tensor_mode=True)
    pairing, aligned = align_rows(npu, ref, modules=modules)
    partner = {name: (ref.names[j] if j >= 0 else None) for name, j in zip(npu.names, pairing.bench_index,
                                                                            strict=True)}  # fmt: skip
    return [g.label for g in aligned.gaps], partner


def test_a_call_pairs_only_inside_its_modules_partner(tmp_path: Path) -> None:
    npu, bench = _module_pair(tmp_path)
    # module-blind, the target's exp (module a) pairs with the bench's (module b), and module b's own
    # rows are left without a partner on either side
    labels, partner = _gaps_of(npu, bench, None)
    assert partner["Torch.exp.0.forward.output.0"] == "Torch.exp.0.forward.output.0"
    assert labels == ["target (no call) ~ bench Module.b.B.forward.0",
                      "target Module.b.B.forward.0 ~ bench (no call)"]
    # with each side's construct.json, each exp is a gap of its own module, and the modules pair
    modules = (load_construct(npu.parent / "construct.json"), load_construct(bench.parent / "construct.json"))
    labels, partner = _gaps_of(npu, bench, modules)
    assert labels == ["target Torch.exp.0.forward ~ bench (no call)",
                      "target (no call) ~ bench Torch.exp.0.forward"]
    assert partner["Torch.exp.0.forward.output.0"] is None
    assert partner["Module.b.B.forward.0.output.0"] == "Module.b.B.forward.0.output.0"
    # the engine reads both construct.json files
    result = compare_dumps(npu, bench, CompareOptions(replay_top=0))
    assert {g for g in _col(result, "Parity Gap") if g} == set(labels)


def test_without_modules_the_alignment_is_the_whole_sequence(tmp_path: Path) -> None:
    """L1 (construct.json ``{}``) or no construct.json at all: the module-blind alignment."""
    npu, bench = _module_pair(tmp_path, construct=False)
    blind = _gaps_of(npu, bench, None)
    assert _gaps_of(npu, bench, ({}, {})) == blind
    result = compare_dumps(npu, bench, CompareOptions(replay_top=0))
    assert {g for g in _col(result, "Parity Gap") if g} == set(blind[0])
    (npu.parent / "construct.json").unlink()
    assert call_modules(npu, bench)() is None


def test_modules_pair_by_name_then_by_path_and_a_gap_is_cut_at_a_module_boundary() -> None:
    target = {"Module.ln.FusedLayerNorm.forward.0": None, "Module.a.A.forward.0": None,
              "Module.a.A.forward.1": None, "Torch.add.0.forward": "Module.a.A.forward.0"}
    bench = {"Module.ln.LayerNorm.forward.0": None, "Module.a.A.forward.0": None,
             "Module.a.X.forward.1": None, "Module.a.Y.forward.1": None}
    # by name, then by path (a renamed class); Module.a.*.forward.1 is two nodes on the bench: no partner
    assert pair_modules(target, bench) == {
        "Module.ln.FusedLayerNorm.forward.0": "Module.ln.LayerNorm.forward.0",
        "Module.a.A.forward.0": "Module.a.A.forward.0",
    }
    # target calls 0-3 in scopes a, a, b, b; bench calls 0-2 in b, c, b
    cut = split_by_scope((0, 4, 0, 3), ["a", "a", "b", "b"], ["b", "c", "b"])
    assert cut == [(0, 2, 0, 0), (2, 4, 0, 1), (4, 4, 1, 2), (4, 4, 2, 3)]
    assert split_by_scope((0, 2, 0, 1), [None, None], [None]) == [(0, 2, 0, 1)]


def test_alternating_scopes_align_in_linear_work(tmp_path: Path) -> None:
    """Issue 37's probe (``tests/alignment_probes.py``) at 20,000 calls a side: every call a gap of its own
    module scope, every tensor of one value. Quadratic before (50,000 held a worker 3 min 50 s), about a
    second now (``benchmarks/bench_alignment_scale.py`` times 200,000); each gap pairs its call's input and
    output with the bench's call of the same scope and place."""
    from tests.alignment_probes import write_alternating_scopes

    calls = 20_000
    target, bench = write_alternating_scopes(tmp_path, calls)
    npu = side_rows(load_dump(target), tensor_mode=False)
    ref = side_rows(load_dump(bench), tensor_mode=False)
    modules = (load_construct(target.parent / "construct.json"),
               load_construct(bench.parent / "construct.json"))  # fmt: skip
    pairing, aligned = align_rows(npu, ref, modules=modules)
    assert len(aligned.gaps) == calls
    assert aligned.gaps[3].label == "target Torch.add.3.forward ~ bench Torch.mul.3.forward"
    assert all(j >= 0 for j in pairing.bench_index) and len(set(pairing.bench_index)) == 2 * calls
