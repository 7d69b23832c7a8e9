"""The next dump's plan (``parity.shared.plan``): suspects from a comparison's summary, neighbours from the
dump's data flow, msprobe's config.json out."""

from __future__ import annotations

from typing import Any

import pytest
from parity.shared.plan import STATISTICS_FOR_ALL, DataFlow, PlanError, call_entries, make_plan

from tests.factories import stats_leaf


def leaf(value: float, *, shape: tuple[int, ...] = (4,)) -> dict[str, Any]:
    """A tensor leaf whose statistics (max ``value``, min ``value / 2``) are a fingerprint of its own."""
    return stats_leaf(value, value / 2, value * 0.75, value * 2, shape=shape)


def chain_dump() -> dict[str, Any]:
    """linear(x, w) -> a; gelu(a) -> b; add(b, c) -> d; mul(d) -> e, then backward of gelu, in dump order."""
    x, w, a, b, c, d, e = (leaf(v) for v in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0))
    return {"level": "L1", "data": {
        "Functional.linear.0.forward": {"input_args": [x, w], "input_kwargs": {}, "output": [a]},
        "Functional.gelu.0.forward": {"input_args": [a], "input_kwargs": {}, "output": [b]},
        "Tensor.add.0.forward": {"input_args": [b, c], "input_kwargs": {}, "output": [d]},
        "Tensor.mul.0.forward": {"input_args": [d, {"type": "int", "value": 2}], "input_kwargs": {},
                                 "output": [e]},
        "Tensor.mul.0.backward": {"input": [leaf(8.0)], "output": [leaf(9.0)]},
        "Tensor.add.0.backward": {"input": [leaf(9.0)], "output": [leaf(10.0)]},
        "Functional.gelu.0.backward": {"input": [leaf(10.0)], "output": [leaf(11.0)]},
        "Functional.linear.0.backward": {"input": [leaf(11.0)], "output": [leaf(12.0), leaf(13.0)]},
    }}  # fmt: skip


def summary(*ranks: dict[str, Any], kind: str = "multi-rank") -> dict[str, Any]:
    if kind == "single-rank":
        return {"format_version": 1, "kind": kind, **ranks[0]}
    return {"format_version": 1, "kind": kind, "ranks": list(ranks)}


def rank_doc(rank: int, *suspects: tuple[str, float], first: str | None = None,
             npu_path: str = "/d/target/step3/rank0/dump.json") -> dict[str, Any]:  # fmt: skip
    return {"rank": rank, "mode": "statistics", "npu_path": npu_path,
            "suspects": [{"api": api, "score": score} for api, score in suspects],
            "first_divergence": {"api": first, "score": 0.5} if first else None}  # fmt: skip


def test_call_entries_name_both_directions_of_a_call() -> None:
    gelu, linear = "Functional.gelu.3", "Module.fc.Linear"
    assert call_entries(f"{gelu}.backward") == [f"{gelu}.backward", f"{gelu}.forward"]
    assert call_entries(f"{linear}.forward.2") == [f"{linear}.forward.2", f"{linear}.backward.2"]
    assert call_entries("Module.fc.Linear.parameters_grad") == ["Module.fc.Linear.parameters_grad"]


def test_data_flow_follows_statistics_and_skips_constants() -> None:
    flow = DataFlow(chain_dump()["data"])
    assert flow.neighbours(["Functional.gelu.0.forward"], 1) == ["Functional.linear.0.forward",
                                                                  "Tensor.add.0.forward"]  # fmt: skip
    assert flow.neighbours(["Functional.gelu.0.forward"], 2)[-1] == "Tensor.mul.0.forward"
    # backward entries chain through the gradients they pass on
    assert flow.neighbours(["Functional.gelu.0.backward"], 1) == [
        "Tensor.add.0.backward", "Functional.linear.0.backward"]  # fmt: skip
    zeros = stats_leaf(0.0, 0.0, 0.0, 0.0)
    data = {"Torch.zeros.0.forward": {"input_args": [], "input_kwargs": {}, "output": [zeros]},
            "Torch.a.0.forward": {"input_args": [leaf(1.0)], "input_kwargs": {}, "output": [leaf(2.0)]},
            "Torch.b.0.forward": {"input_args": [zeros, leaf(2.0)], "input_kwargs": {},
                                  "output": [leaf(3.0)]}}  # fmt: skip
    # a constant (zeros) names no producer; the real input does
    assert DataFlow(data).producers[2] == {1}


def test_data_flow_falls_back_to_call_order_where_nothing_matches() -> None:
    data = {"Torch.a.0.forward": {"input_args": [leaf(1.0)], "input_kwargs": {}, "output": [leaf(2.0)]},
            "Torch.b.0.forward": {"input_args": [leaf(5.0)], "input_kwargs": {}, "output": [leaf(6.0)]}}
    assert DataFlow(data).neighbours(["Torch.b.0.forward"], 1) == ["Torch.a.0.forward"]


def test_plan_lists_top_suspects_across_ranks_and_the_first_divergence() -> None:
    doc = summary(rank_doc(0, ("Torch.a.0.forward", 3.0), ("Torch.b.0.forward", 1.0)),
                  rank_doc(1, ("Torch.c.0.backward", 2.0), first="Torch.z.0.forward"))  # fmt: skip
    plan = make_plan(doc, top=2, neighbours=0)
    assert [(c.api, c.rank, c.role) for c in plan.calls] == [
        ("Torch.a.0.forward", 0, "suspect"), ("Torch.c.0.backward", 1, "suspect"),
        ("Torch.z.0.forward", 1, "first divergence"),
    ]  # fmt: skip
    config = plan.config("./out")
    assert config["task"] == "tensor" and config["dump_path"] == "./out" and config["level"] == "L1"
    assert config["rank"] == [0, 1] and config["step"] == [3]  # where they diverged
    assert config["tensor"]["list"] == ["Torch.a.0.forward", "Torch.a.0.backward", "Torch.c.0.backward",
                                        "Torch.c.0.forward", "Torch.z.0.forward", "Torch.z.0.backward"]
    assert config["tensor"][STATISTICS_FOR_ALL] is True and config["tensor"]["scope"] == []
    assert "planned_by" not in config  # a summary file has no comparison id


def test_one_compared_rank_dumps_every_rank_as_msprobe_needs_on_one_card() -> None:
    plan = make_plan(summary(rank_doc(0, ("Torch.a.0.forward", 3.0)), kind="single-rank"), neighbours=0,
                     comparison="c1")  # fmt: skip
    assert plan.config()["rank"] == [] and plan.config()["planned_by"] == "c1"


def test_neighbours_come_from_the_target_dump_and_name_its_level() -> None:
    seen: list[tuple[int | None, str | None]] = []

    def load(rank: int | None, npu_path: str | None) -> dict[str, Any]:
        seen.append((rank, npu_path))
        return {**chain_dump(), "level": "mix"}

    plan = make_plan(summary(rank_doc(0, ("Functional.gelu.0.forward", 4.0))), neighbours=1, load_dump=load)
    assert seen == [(0, "/d/target/step3/rank0/dump.json")]
    assert [(c.api, c.role) for c in plan.calls] == [
        ("Functional.gelu.0.forward", "suspect"), ("Functional.linear.0.forward", "neighbour"),
        ("Tensor.add.0.forward", "neighbour"),
    ]  # fmt: skip
    assert plan.level == "mix"


def test_neighbours_without_the_dump_are_one_clear_error() -> None:
    with pytest.raises(PlanError, match="needs the target dump.json"):
        make_plan(summary(rank_doc(0, ("Torch.a.0.forward", 3.0))), neighbours=1, load_dump=lambda r, p: None)


def test_no_suspects_is_a_plan_without_calls() -> None:
    plan = make_plan(summary(rank_doc(0)), neighbours=1)
    assert plan.calls == [] and plan.notes == ["the comparison has no suspects"]


@pytest.mark.parametrize("doc, message", [
    ([], "top level must be a JSON object"),
    ({"format_version": 2, "kind": "multi-rank", "ranks": []}, "format_version 2"),
    ({"format_version": 1, "kind": "xlsx"}, "kind 'xlsx'"),
    ({"format_version": 1, "kind": "multi-rank", "ranks": {}}, "'ranks' must be a list"),
    ({"format_version": 1, "kind": "multi-rank", "ranks": [{"suspects": [{"score": 1}]}]}, "no 'api'"),
])  # fmt: skip
def test_a_summary_of_another_format_is_refused(doc: Any, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        make_plan(doc)


def test_data_flow_from_the_stored_columns_is_the_same(tmp_path: Any) -> None:
    """The server builds the flow from a dump's parsed columns (its sidecar), never the dump.json text
    (issue 37): the same producers and consumers as from the document."""
    import json

    from parity.shared.dump.reader import load_dump

    doc = {"task": "statistics", "framework": "pytorch", "dump_data_dir": None, **chain_dump()}
    (tmp_path / "dump.json").write_text(json.dumps(doc))
    columns = load_dump(tmp_path / "dump.json").columns
    ours, theirs = DataFlow.from_columns(columns), DataFlow(chain_dump()["data"])
    assert ours.names == theirs.names
    assert (ours.producers, ours.consumers) == (theirs.producers, theirs.consumers)
    assert any(ours.producers) and any(ours.consumers)
