"""msprobe 8.3.3's layout, entry for entry: the same entry names in the same order, arguments positional or
keyword exactly as the caller passed them, no defaults the caller did not pass.

The oracle is msprobe itself: ``data/msprobe833_mix_layout.json`` is msprobe 8.3.3's own dump of ``Net``
below (made with mindstudio-probe 8.3.3 in a separate virtualenv), each tensor leaf reduced to shape and
dtype; msprobe's ``is_recompute`` flag is left out (Parity does not write it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from parity.client import PrecisionDebugger
from torch import nn
from torch.nn import functional as F

from tests.client.conftest import load_data

ORACLE = Path(__file__).parent / "data" / "msprobe833_mix_layout.json"


class Net(nn.Module):
    """Positional calls from torch's own modules (layer_norm, dropout), a keyword from the user (eps), a
    no-op ``float()`` and ``cross_entropy`` with its defaults left out."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.ln = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.1)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.ln(F.relu(self.fc1(x))))
        h = F.layer_norm(h, (16,), eps=1e-6)
        return self.fc2(h).float()


def _layout(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_layout(v) for v in value]
    if isinstance(value, dict) and value.get("type") == "torch.Tensor":
        return {"tensor": value["shape"], "dtype": value["dtype"]}
    if isinstance(value, dict) and "type" in value:
        return value
    if isinstance(value, dict):
        return {k: _layout(v) for k, v in value.items()}
    return value


def test_mix_dump_has_msprobe_833_entries_and_argument_layout(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x, y = Net(), torch.randn(4, 8), torch.tensor([0, 1, 2, 3])
    PrecisionDebugger(dump_path=str(tmp_path), level="mix")
    PrecisionDebugger.start(model)
    F.cross_entropy(model(x), y).backward()
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    ours = {name: _layout(entry) for name, entry in load_data(tmp_path).items()}
    oracle = json.loads(ORACLE.read_text())["entries"]
    assert list(ours) == list(oracle)
    for name, entry in oracle.items():
        assert ours[name] == entry, name


def test_arguments_spelled_as_the_caller_spelled_them(tmp_path: Path) -> None:
    x = torch.randn(4, 6, requires_grad=True)
    PrecisionDebugger(dump_path=str(tmp_path), level="L1")
    PrecisionDebugger.start()
    x.split(2, dim=1)
    F.dropout(x, 0.5, training=False)
    F.dropout(*[x], **{"p": 0.5})  # a call site that does not say: the function's own spelling, all values
    image = torch.randn(1, 2, 4, 4, requires_grad=True)
    nn.MaxPool2d(2)(image)  # through F.max_pool2d's boolean dispatch: as nn.MaxPool2d spells the call
    F.max_pool2d(image, 2)
    PrecisionDebugger.stop()
    PrecisionDebugger.step()
    data = load_data(tmp_path)

    def spelled(name: str) -> tuple[list[Any], dict[str, Any]]:
        entry = data[name]
        args = [a.get("value", "T") if a else a for a in entry["input_args"]]
        return args, {k: v["value"] for k, v in entry["input_kwargs"].items()}

    assert spelled("Tensor.split.0.forward") == (["T", 2], {"dim": 1})
    assert spelled("Functional.dropout.0.forward") == (["T", 0.5], {"training": False})
    assert spelled("Functional.dropout.1.forward") == (["T"], {"p": 0.5, "training": True, "inplace": False})
    as_msprobe = (["T", 2, 2, 0, 1], {"ceil_mode": False, "return_indices": False})  # msprobe 8.3.3's record
    assert spelled("Functional.max_pool2d.0.forward") == as_msprobe
    assert spelled("Functional.max_pool2d.1.forward") == (["T", 2], {})
