"""stack.json groups: the cached walk (kept frames, nn.Module's call frames walked through) groups every call
exactly as a full walk of its stack by line numbers does."""

from __future__ import annotations

import linecache
import sys
from collections.abc import Iterator
from types import FrameType

import torch
from parity.client.call_stacks import CallStacks, Stacks
from torch import nn


class FullWalk:
    """The reference: every call's whole stack, as text, grouped in order of first appearance."""

    def __init__(self) -> None:
        self.groups: Stacks = []
        self._index: dict[tuple[str, ...], int] = {}

    def record(self, name: str, frame: FrameType | None) -> None:
        frames = []
        f = frame
        while f is not None:
            c, ln = f.f_code, f.f_lineno or 0
            frames.append(f"File {c.co_filename}, line {ln}, in {c.co_name}, \n "
                          f"{linecache.getline(c.co_filename, ln).strip()}")  # fmt: skip
            f = f.f_back
        key = tuple(frames)
        if key not in self._index:
            self._index[key] = len(self.groups)
            self.groups.append(([], frames))
        self.groups[self._index[key]][0].append(name)


class Both:
    def __init__(self) -> None:
        self.cached, self.full = CallStacks(), FullWalk()
        self.n = 0

    def record(self, frame: FrameType) -> None:
        name = f"call.{self.n}"
        self.n += 1
        self.cached.record(name, frame)
        self.full.record(name, frame)


def _leaf(rec: Both) -> None:
    rec.record(sys._getframe(1))  # the caller's frame, as the function mode passes it
    rec.record(sys._getframe(1))


def _twice(rec: Both, depth: int) -> None:
    if depth:
        _twice(rec, depth - 1)  # recursion: the same code on several frames
    _leaf(rec)
    for _ in range(2):
        _leaf(rec)  # a loop: the same frame at the same offset
    _leaf(rec)


def _gen(rec: Both) -> Iterator[None]:
    while True:
        _leaf(rec)
        yield  # resumed from different callers: its frame is never kept


class Hooked(nn.Module):
    def __init__(self, rec: Both) -> None:
        super().__init__()
        self.rec = rec
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        _leaf(self.rec)
        for _ in range(2):
            x = self.b(x)  # the same module from a loop
        return self.a(x)


def _steps(rec: Both, model: nn.Module, gen: Iterator[None], steps: int) -> None:
    for step in range(steps):
        _twice(rec, 2)
        next(gen)
        model(torch.ones(1, 2))
        _twice(rec, step)
        next(gen)

        def inner() -> None:
            next(gen)  # the generator resumed from a deeper frame
            _twice(rec, 1)

        inner()
        model(torch.ones(1, 2))
        rec.cached.release_frames()  # a flush between steps: the walk starts over


def test_cached_walk_groups_as_the_full_walk() -> None:
    rec = Both()
    model = nn.Sequential(Hooked(rec), Hooked(rec))
    for m in model.modules():  # a forward pre-hook records its caller, nn.Module's ``inner``, as the recorder
        m.register_forward_pre_hook(lambda *_: rec.record(sys._getframe(1)))
    gen = _gen(rec)
    _steps(rec, model, gen, 2)
    assert rec.n > 100
    assert rec.cached.groups == rec.full.groups
    assert len(rec.cached.groups) > 10  # not everything in a group or two
    # the next step's groups (numbers, lines and text kept from the steps before) are its own, complete
    rec.cached, rec.full = CallStacks(), FullWalk()
    _steps(rec, model, gen, 3)
    assert rec.cached.groups == rec.full.groups
