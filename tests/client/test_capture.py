"""Capture of the four reference models at L0, L1 and mix: entries, stable names, clean self-compare."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from parity.client import PrecisionDebugger
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import RowStatus

from tests.client.conftest import dump_once, load_data, model_and_input, train_step

# Entries each model must produce at L1 (APIs) and L0 (modules), forward and backward.
EXPECTED_APIS = {
    "mlp": ["Functional.linear.0", "Functional.relu.0", "Functional.linear.1", "Tensor.__pow__.0"],
    "cnn": ["Functional.conv2d.0", "Functional.batch_norm.0", "Functional.relu.0", "Functional.max_pool2d.0",
            "Torch.flatten.0", "Functional.linear.0"],
    "transformer": ["Functional.embedding.0", "Tensor.chunk.0", "Torch.softmax.0", "Tensor.__matmul__.0",
                    "Functional.layer_norm.0", "Functional.gelu.0", "Functional.dropout.0",
                    "Tensor.__add__.0"],
    "lstm": ["VF.lstm.0", "Functional.linear.0", "Tensor.__getitem__.0"],
}  # fmt: skip
EXPECTED_MODULES = {
    "mlp": ["Module.fc1.Linear", "Module.act.ReLU", "Module.fc2.Linear"],
    "cnn": ["Module.conv.Conv2d", "Module.bn.BatchNorm2d", "Module.pool.MaxPool2d", "Module.fc.Linear"],
    "transformer": ["Module.emb.Embedding", "Module.ln.LayerNorm", "Module.ff.1.GELU", "Module.ff.Sequential",
                    "Module.head.Linear"],
    "lstm": ["Module.lstm.LSTM", "Module.fc.Linear"],
}  # fmt: skip
PARAMS = {"mlp": "Module.fc1.Linear", "cnn": "Module.conv.Conv2d", "transformer": "Module.head.Linear",
          "lstm": "Module.lstm.LSTM"}  # fmt: skip

MODELS = ["mlp", "cnn", "transformer", "lstm"]


@pytest.mark.parametrize("level", ["L0", "L1", "mix"])
@pytest.mark.parametrize("kind", MODELS)
def test_capture_names_stable_and_self_compare_passes(tmp_path: Path, kind: str, level: str) -> None:
    a = dump_once(tmp_path / "a", kind, level)
    b = dump_once(tmp_path / "b", kind, level)
    data = load_data(a)
    names = list(data)
    if level in ("L1", "mix"):
        for api in EXPECTED_APIS[kind]:
            assert f"{api}.forward" in data, (api, names)
            assert f"{api}.backward" in data, (api, names)
        assert set(data[f"{EXPECTED_APIS[kind][0]}.forward"]) == {"input_args", "input_kwargs", "output"}
        assert set(data[f"{EXPECTED_APIS[kind][0]}.backward"]) == {"input", "output"}
    else:
        assert not any(n.startswith(("Functional.", "Tensor.", "Torch.")) for n in names)
    if level in ("L0", "mix"):
        for mod in EXPECTED_MODULES[kind]:
            assert f"{mod}.forward.0" in data, (mod, names)
            assert f"{mod}.backward.0" in data, (mod, names)
        grads = data[f"{PARAMS[kind]}.parameters_grad"]
        assert all(isinstance(v, list) and len(v) == 1 for v in grads.values())
        assert "weight" in grads or "weight_ih_l0" in grads
    else:
        assert not any(n.startswith("Module.") for n in names)
    # only outermost calls (F.relu calls torch.relu inside), never the tool's own statistics
    assert not any(
        n.startswith(("Torch.relu.", "Torch.aminmax.", "Torch.vector_norm.", "Torch.stack.")) for n in names
    )
    assert names == list(load_data(b)), "the same model run twice must give the same names in the same order"

    result = compare_dumps(a / "step0/rank0/dump.json", b / "step0/rank0/dump.json", CompareOptions())
    assert result.rows
    bad = [(r.api, r.status) for r in result.rows if r.status is not RowStatus.PASS]
    assert not bad, bad[:5]



def test_optimizer_step_records_its_maths_not_its_bookkeeping(tmp_path: Path) -> None:
    """An optimizer's ``record_function`` profiler ranges and grad-mode switches are not APIs."""
    PrecisionDebugger.reset()
    PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    model, x = model_and_input("mlp")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    PrecisionDebugger.start(model)
    train_step(model, x)
    optimizer.step()  # opens a profiler range and runs under no_grad
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    names = list(load_data(tmp_path))
    PrecisionDebugger.reset()
    assert any(n.startswith("Tensor.add_.") for n in names), names  # the update itself is recorded
    bookkeeping = [n for n in names if "profiler" in n or "grad_enabled" in n or "RecordFunction" in n]
    assert not bookkeeping, bookkeeping
