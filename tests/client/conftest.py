"""Fixtures of the client tests: a fresh debugger singleton per test, tiny models, and one-step dumps."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from parity.client import PrecisionDebugger
from torch import nn
from torch.nn import functional as F


@pytest.fixture(autouse=True)
def fresh_debugger() -> Iterator[None]:
    PrecisionDebugger.reset()
    yield
    PrecisionDebugger.reset()


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(F.relu(self.bn(self.conv(x)))), 1))


class TinyTransformer(nn.Module):
    def __init__(self, vocab: int = 20, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.emb(tokens)
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1)
        h = self.ln(h + self.drop(self.proj(att @ v)))
        h = h + self.ff(h)
        return self.head(h)


class LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def model_and_input(kind: str) -> tuple[nn.Module, torch.Tensor]:
    """A freshly seeded model and input: two calls give identical models and data."""
    torch.manual_seed(0)
    if kind == "mlp":
        return MLP(), torch.randn(4, 8)
    if kind == "cnn":
        return CNN(), torch.randn(2, 3, 8, 8)
    if kind == "transformer":
        return TinyTransformer(), torch.randint(0, 20, (2, 6))
    if kind == "lstm":
        return LSTMNet(), torch.randn(2, 5, 6)
    raise ValueError(kind)


def train_step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    out = model(x)
    loss = (out.float() ** 2).mean()
    loss.backward()
    return loss


def dump_once(
    tmp: Path,
    kind: str,
    level: str,
    *,
    steps: int = 1,
    config: dict[str, Any] | None = None,
    wrap: Callable[[Callable[[], torch.Tensor]], torch.Tensor] | None = None,
    **kwargs: Any,
) -> Path:
    """Run ``steps`` training steps of ``kind`` under a debugger at ``level``; returns the dump root."""
    PrecisionDebugger.reset()
    cfg_path = None
    if config is not None:
        tmp.mkdir(parents=True, exist_ok=True)
        cfg_path = tmp / "config.json"
        cfg_path.write_text(json.dumps(config))
    PrecisionDebugger(cfg_path, dump_path=str(tmp), level=level, **kwargs)
    model, x = model_and_input(kind)
    torch.manual_seed(1)  # dropout masks
    for _ in range(steps):
        PrecisionDebugger.start(model)
        if wrap is None:
            train_step(model, x)
        else:
            wrap(lambda: train_step(model, x))
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
    PrecisionDebugger.reset()
    return tmp


def load_data(root: Path, step: int = 0, rank: int = 0) -> dict[str, Any]:
    """``data`` of one dump.json, after the debugger's background writer (if any) has written it."""
    inst = PrecisionDebugger._instance
    if inst is not None and getattr(inst, "_initialised", False):
        PrecisionDebugger.drain()
    doc = json.loads((root / f"step{step}" / f"rank{rank}" / "dump.json").read_text())
    return doc["data"]
