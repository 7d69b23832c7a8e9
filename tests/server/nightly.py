"""The team's daily loop in small: a float32 baseline of a little MLP and nightly runs of it under bfloat16
(an accepted drift: every call's output is centred, so its mean is about zero and bfloat16's rounding moves
it by more than half, which statistics mode calls failing, while its maximum moves by a few 0.1% at most),
the last nightly carrying a real regression on one GELU call. Written as msprobe dumps."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.factories import DumpBuilder

GELU = "Functional.gelu.1.forward"
#: The calls of one step, in execution order.
CALLS = ("Functional.linear.0.forward", "Functional.gelu.0.forward", "Functional.linear.1.forward", GELU,
         "Functional.linear.2.forward")  # fmt: skip


def mlp_dump(root: Path, *, bf16: bool = False, gelu_off: float = 0.0, task: str = "statistics",
             steps: tuple[int, ...] = (0,), md5: bool = False, stacks: bool = False) -> Path:  # fmt: skip
    """``root/step{N}/rank0`` for each of ``steps``: linear → gelu → linear → gelu → linear on the same
    data each time, each output centred (mean about 0). ``bf16`` casts every output to bfloat16 (the
    nightlies' drift); ``gelu_off`` scales the second GELU's output by ``1 + gelu_off`` (the regression),
    which the last linear carries on; ``md5`` adds checksums (``summary_mode: md5``); ``stacks`` writes a
    stack.json naming the line of ``train.py`` that made each call (:func:`stack_line`)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 32, generator=gen)
    weights = [torch.randn(32, 32, generator=gen) / 6 for _ in range(3)]
    for step in steps:
        builder = DumpBuilder(task, md5=md5)
        h = x
        for k, w in enumerate(weights):
            y = torch.nn.functional.linear(h, w)
            y = y - y.mean()
            y = y.to(torch.bfloat16) if bf16 else y
            builder.api(f"Functional.linear.{k}.forward", inputs=[h, w], outputs=[y])
            if k == 2:
                break
            g = torch.nn.functional.gelu(y.float())
            g = g - g.mean()
            g = g * (1 + gelu_off) if k == 1 else g
            g = g.to(torch.bfloat16) if bf16 else g
            builder.api(f"Functional.gelu.{k}.forward", inputs=[y], outputs=[g])
            h = g.float()
        if stacks:
            builder.stack = {api: [stack_line(api)] for api in CALLS}
        builder.write(root / f"step{step}" / "rank0")
    return root


def stack_line(api: str) -> str:
    """The frame ``mlp_dump(stacks=True)`` records for ``api``: a line of train.py of its own."""
    return f'File "train.py", line {20 + CALLS.index(api)}, in forward, {api.split(".")[1]}(h)'

