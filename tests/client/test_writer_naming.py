"""shared/dump/writer.py and naming.py: the JSON text and the name grammar the engine parses back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from parity.shared.dump.naming import (
    api_entry,
    backward_of,
    module_entry,
    param_grad_entry,
    param_grad_file,
    parse_entry,
    tensor_file,
)  # fmt: skip
from parity.shared.dump.writer import RankDirWriter, dumps_indent1


@pytest.mark.parametrize(
    "doc",
    [
        {"a": [1, 2.5, None, True, False, "x\u00e9\n"], "b": {}, "c": [], "d": {"e": {"f": [[]]}}},
        {
            "nan": float("nan"),
            "inf": [float("inf"), float("-inf")],
            "big": 1e300,
            "tiny": 5e-324,
            "neg": -0.0,
        },
        [],
        "s",
    ],
)
def test_dumps_indent1_is_byte_identical_to_json(doc: object) -> None:
    assert dumps_indent1(doc) == json.dumps(doc, indent=1)


def test_rank_dir_writer_layout(tmp_path: Path) -> None:
    writer = RankDirWriter(tmp_path / "step0" / "rank0")
    dump_json = writer.write(task="tensor", level="L1", data={"Torch.add.0.forward": {}}, tensors=True,
                             stacks=[(["Torch.add.0.forward"], ["File a.py, line 1, in f, \n x"])],
                             construct={})  # fmt: skip
    doc = json.loads(dump_json.read_text())
    assert doc["dump_data_dir"] == str((tmp_path / "step0/rank0/dump_tensor_data").resolve())
    assert json.loads((tmp_path / "step0/rank0/stack.json").read_text()) == {
        "0": [["Torch.add.0.forward"], ["File a.py, line 1, in f, \n x"]]}  # fmt: skip
    assert not list((tmp_path / "step0/rank0").glob(".*.tmp"))


def test_names_round_trip() -> None:
    fwd = api_entry("Functional", "linear", 3)
    assert fwd == "Functional.linear.3.forward" and backward_of(fwd) == "Functional.linear.3.backward"
    mod = module_entry("layers.0.attn", "Attention", "forward", 2)
    assert mod == "Module.layers.0.attn.Attention.forward.2"
    assert backward_of(mod) == "Module.layers.0.attn.Attention.backward.2"
    p = parse_entry(mod)
    assert p is not None and (p.kind, p.name, p.cls, p.index, p.direction) == (
        "module", "layers.0.attn", "Attention", 2, "forward")  # fmt: skip
    grad = param_grad_entry("fc", "Linear", 0, list_index=1)
    assert grad == "Module.1.fc.Linear.parameters_grad.0" and parse_entry(grad).kind == "parameters_grad"  # type: ignore[union-attr]
    assert param_grad_file(grad, "weight") == "Module.1.fc.Linear.parameters_grad.0.weight.pt"
    assert tensor_file(fwd, "input", (0, 1)) == "Functional.linear.3.forward.input.0.1.pt"
    assert tensor_file(fwd, "kwargs", ("bias",)) == "Functional.linear.3.forward.kwargs.bias.pt"
    api = parse_entry("Tensor.__add__.0.backward")
    assert api is not None and (api.prefix, api.name, api.direction) == ("Tensor", "__add__", "backward")
    assert parse_entry("garbage") is None
