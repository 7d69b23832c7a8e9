"""The msprobe on-disk layout: files, key order, leaf encodings, tensor files, md5, stack and construct."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import torch
from parity.client import PrecisionDebugger

from tests.client.conftest import dump_once, load_data

TENSOR_KEYS = ["type", "dtype", "shape", "Max", "Min", "Mean", "Norm", "requires_grad"]


def test_statistics_layout_and_leaf_encoding(tmp_path: Path) -> None:
    root = dump_once(tmp_path, "transformer", "mix")
    rank_dir = root / "step0" / "rank0"
    doc = json.loads((rank_dir / "dump.json").read_text())
    assert list(doc) == ["task", "level", "framework", "dump_data_dir", "data"]
    assert (doc["task"], doc["level"], doc["framework"], doc["dump_data_dir"]) == (
        "statistics",
        "mix",
        "pytorch",
        None,
    )
    leaf = doc["data"]["Functional.linear.0.forward"]["input_args"][0]
    assert list(leaf) == TENSOR_KEYS and leaf["dtype"] == "torch.float32" and isinstance(leaf["Max"], float)
    chunk = doc["data"]["Tensor.chunk.0.forward"]
    assert chunk["input_args"][1] == {"type": "int", "value": 3}
    assert chunk["input_kwargs"] == {"dim": {"type": "int", "value": -1}}
    assert len(chunk["output"]) == 3
    # a module entry is re-inserted when its forward completes: after the APIs it contains
    names = list(doc["data"])
    assert names.index("Module.emb.Embedding.forward.0") > names.index("Functional.embedding.0.forward")
    construct = json.loads((rank_dir / "construct.json").read_text())
    assert construct["Functional.gelu.0.forward"] == "Module.ff.1.GELU.forward.0"
    assert construct["Module.ff.1.GELU.forward.0"] == "Module.ff.Sequential.forward.0"
    assert construct["Module.ff.Sequential.forward.0"] is None
    assert construct["Functional.gelu.0.backward"] == "Module.ff.1.GELU.backward.0"
    stack = json.loads((rank_dir / "stack.json").read_text())
    grouped = [name for names_, _frames in stack.values() for name in names_]
    assert "Functional.gelu.0.forward" in grouped and len(grouped) == len(set(grouped))
    assert not any(n.endswith(".backward") for n in grouped)
    frames = next(f for n, f in stack.values() if "Tensor.chunk.0.forward" in n)
    assert frames[0].startswith("File ") and "conftest.py" in frames[0] and ", \n " in frames[0]
    assert not any("/client/" in f and "parity" in f for f in frames)


def test_l1_construct_is_empty_and_extra_info_off_writes_no_side_files(tmp_path: Path) -> None:
    root = dump_once(tmp_path / "a", "mlp", "L1")
    assert json.loads((root / "step0/rank0/construct.json").read_text()) == {}
    root = dump_once(tmp_path / "b", "mlp", "L1", config={"extra_info": False})
    assert sorted(p.name for p in (root / "step0/rank0").iterdir()) == ["dump.json"]


def test_tensor_task_files_load_safely_and_match_json(tmp_path: Path) -> None:
    root = dump_once(tmp_path, "mlp", "mix", task="tensor")
    rank_dir = root / "step0" / "rank0"
    doc = json.loads((rank_dir / "dump.json").read_text())
    assert doc["dump_data_dir"] == str((rank_dir / "dump_tensor_data").resolve())
    data = doc["data"]
    for name in ("Functional.linear.0.forward.input.0.pt", "Functional.linear.0.forward.output.0.pt",
                 "Functional.linear.0.backward.input.0.pt",
                 "Module.fc1.Linear.forward.0.parameters.weight.pt",
                 "Module.fc1.Linear.parameters_grad.weight.pt"):  # fmt: skip
        assert (rank_dir / "dump_tensor_data" / name).is_file(), name
    leaf = data["Functional.linear.0.forward"]["input_args"][1]
    assert leaf["data_name"] == "Functional.linear.0.forward.input.1.pt"
    t = torch.load(rank_dir / "dump_tensor_data" / leaf["data_name"], weights_only=True, map_location="cpu")
    assert type(t) is torch.Tensor and t.is_contiguous() and list(t.shape) == leaf["shape"]
    assert t.max().item() == leaf["Max"] and t.norm().item() == leaf["Norm"]
    grad_leaf = data["Module.fc1.Linear.parameters_grad"]["weight"][0]
    assert grad_leaf["data_name"] == "Module.fc1.Linear.parameters_grad.weight.pt"


def test_md5_is_crc32_of_raw_bytes_bf16_included(tmp_path: Path) -> None:
    PrecisionDebugger(dump_path=str(tmp_path), level="L1", config_path=None)
    PrecisionDebugger.reset()
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"task": "statistics", "statistics": {"summary_mode": "md5"}}))
    PrecisionDebugger(str(cfg), dump_path=str(tmp_path), level="L1")
    x = torch.randn(5, 3).to(torch.bfloat16)
    PrecisionDebugger.start()
    y = torch.sin(x)
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    leaf = load_data(tmp_path)["Torch.sin.0.forward"]["output"][0]
    expected = zlib.crc32(y.contiguous().view(torch.uint8).numpy().tobytes()) & 0xFFFFFFFF
    assert leaf["md5"] == f"{expected:08x}" and list(leaf)[-1] == "md5" and leaf["dtype"] == "torch.bfloat16"


def test_non_tensor_values_and_special_leaves(tmp_path: Path) -> None:
    PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    x = torch.randn(4, 4)
    PrecisionDebugger.start()
    x[1:3, ...]
    x.to(dtype=torch.float64)
    torch.zeros(2, 2, device=torch.device("cpu"))
    x.reshape(torch.Size([2, 8]))
    torch.full((1,), float("nan")).exp()
    torch.ones(3, dtype=torch.bool).logical_not()
    torch.empty(0).neg()
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    data = load_data(tmp_path)
    assert data["Tensor.__getitem__.0.forward"]["input_args"][1] == [
        {"type": "slice", "value": [1, 3, None]}, {"type": "ellipsis", "value": "..."}]  # fmt: skip
    assert data["Tensor.to.0.forward"]["input_kwargs"]["dtype"] == {
        "type": "torch.dtype",
        "value": "torch.float64",
    }
    assert data["Torch.zeros.0.forward"]["input_kwargs"]["device"] == {
        "type": "torch.device",
        "value": "cpu:None",
    }
    assert data["Tensor.reshape.0.forward"]["input_args"][1] == {"type": "torch.Size", "value": [2, 8]}
    nan_leaf = data["Tensor.exp.0.forward"]["output"][0]
    assert nan_leaf["Max"] != nan_leaf["Max"]  # NaN survives as a bare NaN token
    assert "NaN" in (tmp_path / "step0/rank0/dump.json").read_text()
    bool_leaf = data["Tensor.logical_not.0.forward"]["output"][0]
    assert (bool_leaf["Max"], bool_leaf["Min"], bool_leaf["Mean"], bool_leaf["Norm"]) == (
        False,
        False,
        None,
        None,
    )
    empty = data["Tensor.neg.0.forward"]["output"][0]
    assert (empty["shape"], empty["Max"], empty["Norm"]) == ([0], None, None)
    assert not any(n.startswith(("Tensor.size", "Tensor.dim", "Tensor.shape")) for n in data)


def test_parameter_gradients_named_as_msprobe_833(tmp_path: Path) -> None:
    """One ``Module.{path}.{Class}.parameters_grad`` entry a module and step (no counter, as msprobe 8.3.3),
    placed right after the module's forward entry; two backward passes leave the accumulated gradient."""
    from tests.client.conftest import model_and_input

    PrecisionDebugger(dump_path=str(tmp_path), level="mix", task="tensor")
    model, x = model_and_input("mlp")
    PrecisionDebugger.start(model)
    for _ in range(2):  # gradient accumulation over two micro-batches
        model(x).pow(2).mean().backward()
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    data = load_data(tmp_path)
    names = list(data)
    assert not [n for n in names if ".parameters_grad." in n]
    grad_names = [n for n in names if n.endswith(".parameters_grad")]
    assert grad_names == ["Module.fc1.Linear.parameters_grad", "Module.fc2.Linear.parameters_grad"]
    assert names.index("Module.fc1.Linear.parameters_grad") == names.index("Module.fc1.Linear.forward.0") + 1
    leaf = data["Module.fc1.Linear.parameters_grad"]["weight"][0]
    saved = torch.load(tmp_path / "step0/rank0/dump_tensor_data" / leaf["data_name"], weights_only=True)
    assert leaf["data_name"] == "Module.fc1.Linear.parameters_grad.weight.pt"
    torch.testing.assert_close(saved, model.fc1.weight.grad)
