"""The injected-fault suite behind ``bench_localization.py`` (and its slow test): small models of six
families, one training step each, dumped by Parity's own client (or by msprobe 8.3.3's, from its own venv:
``msprobe_case.py``), one API call degraded in the target run.

A fault is injected by a ``TorchFunctionMode`` entered *below* the client's capture mode: the capture records
a call's inputs, then calls the function, which reaches this mode, which runs it degraded; so the dump shows
exactly what a faulty kernel would have produced, under the call's own entry name. Backward-only faults add a
node hook on the call's autograd node that rewrites the gradients it hands upstream, registered before the
capture's own hook, which therefore records the degraded gradients as that call's backward output.

The noisy variant perturbs every floating output of every call (forward, and backward through the same node
hooks) by a relative ``sigma`` drawn per case between 1e-6 and 1e-4; the bench run is always clean. Real
kernels do not differ so: the two kernel variants (issue 22) let the target compute as another device would,
with no noise anywhere:

* ``f64`` ("another kernel"): every reduction API (``REDUCTION_OPS``: matmul, linear, conv, norms, softmax,
  sum/mean, sdpa, cross_entropy, lstm, ...) runs in float64 and is rounded back to its dtype, forward and
  backward (the backward by calling, for each autograd node of the call, the float64 replica's matching
  node on the real node's gradients), while elementwise ops stay bit-exact, as they are across CPU and GPU;
* ``tf32``: as ``f64``, and the operands of the matmul-class calls (``MATMUL_OPS``: matmul, linear, conv,
  bmm, ...) are also rounded to TF32's 10 mantissa bits: forward, and in the backward the gradients entering
  a GEMM node (``GEMM_NODES``), as a GPU does; its results are float32 (not float16-representable), and the
  view around a 3-D linear's GEMM hands its gradient on exactly.

``device="cuda"`` runs the target on a GPU instead (bench on the CPU), for a machine that has one.

Which dump tool records the run is a ``Dumper``: it says which API call is in flight (the name its dump
uses) and keeps the fault's own tensor work out of the dump. Parity's client is imported only by its dumper,
so msprobe's interpreter, which has no Parity, can run this module.
"""

from __future__ import annotations

import inspect
import json
import math
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

# ------------------------------------------------------------------------------------------------------
# models: (build, batch) per family; every one small enough for a CPU step in tens of milliseconds


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(32, 64), nn.Linear(64, 64), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.l1(x))
        x = F.layer_norm(F.relu(self.l2(x)), (64,))
        return self.l3(x)


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.b1(self.c1(x))), 2)
        x = F.max_pool2d(F.relu(self.b2(self.c2(x))), 2)
        return self.fc(x.flatten(1))


class Block(nn.Module):
    def __init__(self, d: int, causal: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.causal, self.heads = causal, 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        if self.causal:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            att = att.masked_fill(mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(50, 32), nn.Embedding(8, 32)
        self.blocks = nn.ModuleList([Block(32, True), Block(32, True)])
        self.ln, self.head = nn.LayerNorm(32), nn.Linear(32, 50)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


class ViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, 32, 4, stride=4)
        self.blocks = nn.ModuleList([Block(32, False), Block(32, False)])
        self.ln, self.head = nn.LayerNorm(32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x).mean(dim=1))


class ResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.convs = nn.ModuleList([nn.Conv2d(8, 8, 3, padding=1) for _ in range(4)])
        self.bns = nn.ModuleList([nn.BatchNorm2d(8) for _ in range(4)])
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn0(self.stem(x)))
        for i in (0, 2):
            y = F.relu(self.bns[i](self.convs[i](x)))
            x = F.relu(x + self.bns[i + 1](self.convs[i + 1](y)))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.lstm = nn.Embedding(30, 16), nn.LSTM(16, 32, batch_first=True)
        self.fc = nn.Linear(32, 30)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.emb(idx))
        return self.fc(F.layer_norm(out, (32,)))


#: APIs computed as another device's kernel would in the ``f64``/``tf32`` variants: everything that reduces
#: (a sum over some axis: its order and precision are the kernel's choice). Elementwise ops stay exact.
REDUCTION_OPS = frozenset({
    "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "conv1d", "conv2d", "conv3d",
    "conv_transpose2d", "layer_norm", "batch_norm", "group_norm", "instance_norm", "rms_norm", "softmax",
    "log_softmax", "sum", "mean", "cross_entropy", "nll_loss", "scaled_dot_product_attention", "lstm", "gru",
    "adaptive_avg_pool2d", "avg_pool2d", "norm", "var", "std", "logsumexp", "cumsum",
})  # fmt: skip
#: Their matmul-class part, whose operands TF32 rounds to 10 mantissa bits (the ``tf32`` variant).
MATMUL_OPS = frozenset({
    "linear", "matmul", "mm", "bmm", "addmm", "baddbmm", "einsum", "conv1d", "conv2d", "conv3d",
    "conv_transpose2d", "scaled_dot_product_attention", "lstm", "gru",
})  # fmt: skip
#: The autograd nodes of those calls whose backward is a GEMM (or a convolution, or attention's matmuls):
#: where TF32 rounds the incoming gradient as an operand. Views, transposes and elementwise nodes round
#: nothing on a TF32 device.
GEMM_NODES = frozenset({
    "MmBackward0", "AddmmBackward0", "BmmBackward0", "BaddbmmBackward0", "MvBackward0", "AddmvBackward0",
    "ConvolutionBackward0", "ScaledDotProductFlashAttentionForCpuBackward0",
    "_ScaledDotProductEfficientAttentionBackward0", "_ScaledDotProductFlashAttentionBackward0",
})  # fmt: skip
KERNELS = ("f64", "tf32")


def round_tf32(t: torch.Tensor) -> torch.Tensor:
    """``t`` (float32 or float64) with its mantissa rounded to nearest to TF32's 10 bits, in float64."""
    bits = t.float().contiguous().view(torch.int32)
    rounded = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)  # round half up on the 13 dropped bits
    return torch.where(torch.isfinite(t), rounded.double(), t.double())


def _batch(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    if family == "mlp":
        return torch.randn(16, 32, generator=g), torch.randint(0, 10, (16,), generator=g)
    if family in ("cnn", "vit", "resnet"):
        size = 16 if family != "resnet" else 8
        return torch.randn(4, 3, size, size, generator=g), torch.randint(0, 10, (4,), generator=g)
    vocab = 50 if family == "gpt" else 30
    idx = torch.randint(0, vocab, (4, 8), generator=g)
    return idx, torch.randint(0, vocab, (4, 8), generator=g)


MODELS: dict[str, Callable[[], nn.Module]] = {
    "mlp": MLP, "cnn": CNN, "gpt": GPT, "vit": ViT, "resnet": ResNet, "lstm": LSTMNet,
}  # fmt: skip


def build(family: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """The model (same weights on every call) and its batch; built outside the capture."""
    torch.manual_seed(0)
    return MODELS[family](), *_batch(family)


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    """One training step: forward, loss, backward, an SGD update with momentum (per-parameter ops)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=False)
    logits = model(x)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()


# ------------------------------------------------------------------------------------------------------
# faults


@dataclass(frozen=True)
class Fault:
    """One degraded call: the ``index``-th call of API ``api`` (``Functional.gelu``) fails as ``kind``."""

    family: str
    api: str
    index: int
    kind: str

    @property
    def backward(self) -> bool:
        return self.kind.startswith("bwd-")

    @property
    def entry(self) -> str:
        return f"{self.api}.{self.index}.{'backward' if self.backward else 'forward'}"

    @property
    def label(self) -> str:
        return f"{self.family}:{self.entry}:{self.kind}"


FAULTS: list[Fault] = [
    Fault("mlp", "Functional.gelu", 0, "noise-1e-3"),
    Fault("mlp", "Functional.linear", 1, "fp16"),
    Fault("mlp", "Functional.layer_norm", 0, "eps"),
    Fault("mlp", "Functional.linear", 2, "no-bias"),
    Fault("mlp", "Functional.relu", 0, "bwd-noise-1e-3"),
    Fault("mlp", "Functional.linear", 1, "bwd-fp16"),
    Fault("cnn", "Functional.conv2d", 0, "fp16"),
    Fault("cnn", "Functional.conv2d", 1, "noise-1e-3"),
    Fault("cnn", "Functional.batch_norm", 0, "eps"),
    Fault("cnn", "Functional.conv2d", 1, "no-bias"),
    Fault("cnn", "Functional.max_pool2d", 1, "nan"),
    Fault("cnn", "Functional.conv2d", 1, "bwd-fp16"),
    Fault("gpt", "Functional.gelu", 1, "noise-1e-3"),
    Fault("gpt", "Functional.softmax", 0, "bf16"),
    Fault("gpt", "Functional.layer_norm", 2, "eps"),
    Fault("gpt", "Functional.linear", 4, "noise-1e-2"),
    Fault("gpt", "Functional.cross_entropy", 0, "bf16"),
    Fault("gpt", "Functional.linear", 2, "bwd-noise-1e-3"),
    Fault("gpt", "Functional.layer_norm", 1, "bwd-fp16"),
    Fault("vit", "Functional.conv2d", 0, "noise-1e-3"),
    Fault("vit", "Functional.layer_norm", 3, "fp16"),
    Fault("vit", "Functional.linear", 3, "no-bias"),
    Fault("vit", "Functional.softmax", 1, "inf"),
    Fault("vit", "Functional.gelu", 0, "bwd-noise-1e-3"),
    Fault("resnet", "Functional.conv2d", 2, "fp16"),
    Fault("resnet", "Functional.batch_norm", 3, "eps"),
    Fault("resnet", "Functional.conv2d", 3, "noise-1e-2"),
    Fault("resnet", "Functional.relu", 2, "bwd-noise-1e-3"),
    Fault("resnet", "Functional.conv2d", 4, "bwd-fp16"),
    Fault("lstm", "Functional.embedding", 0, "noise-1e-3"),
    Fault("lstm", "Functional.layer_norm", 0, "fp16"),
    Fault("lstm", "Functional.linear", 0, "no-bias"),
    Fault("lstm", "Functional.layer_norm", 0, "bwd-noise-1e-3"),
    Fault("lstm", "Functional.linear", 0, "bwd-fp16"),
]


def _float_tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _float_tensors(v)


def _map_floats(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value) if value.is_floating_point() else value
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_map_floats(v, fn) for v in value)
    if isinstance(value, list):
        return [_map_floats(v, fn) for v in value]
    return value


_TORCH_DIR = str(Path(torch.__file__).parent)


def _first_caller_outside_torch() -> Any:
    """The innermost frame outside torch above the caller's caller (``torch.nn.functional`` and
    ``handle_torch_function`` sit between a dump tool's wrapper and the mode)."""
    frame = sys._getframe(3)
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH_DIR):
        frame = frame.f_back
    return frame


class Dumper(Protocol):
    """A dump tool as the suite drives it."""

    name: str

    def api_in_flight(self) -> str | None:
        """The dump's API name (``Functional.gelu``) for the call reaching the fault mode, or None for the
        tool's own work (copies, statistics), which reaches the mode too and is left alone."""

    def quiet(self) -> AbstractContextManager[object]:
        """A context in which the fault's own tensor work is not dumped."""

    def session(self, dump_dir: Path, task: str, summary_mode: str,
                level: str = "L1") -> AbstractContextManager[object]:  # fmt: skip
        """Configure the tool to dump one step into ``dump_dir`` at ``level``, and finish the dump on exit."""

    def start(self, model: nn.Module | None = None) -> None:
        """Start dumping (``model``: the modules to record, at mix)."""

    def stop(self) -> None: ...


class ParityDumper:
    """Parity's client: its capture is a ``TorchFunctionMode`` above the fault mode, so the fault's own work
    (done inside the fault mode's handler) never reaches it."""

    name = "parity"

    def __init__(self) -> None:
        from parity.client import PrecisionDebugger
        from parity.client.recorder import Recorder

        self.debugger = PrecisionDebugger
        lines, start = inspect.getsourcelines(Recorder.record_api)
        # The lines of ``Recorder.record_api`` that run the recorded function itself.
        self.call_lines = frozenset(start + k for k, line in enumerate(lines)
                                    if "= func(*args, **kwargs)" in line)  # fmt: skip

    def api_in_flight(self) -> str | None:
        """An API call when the first caller outside torch is ``Recorder.record_api`` running the function;
        its ``prefix_api`` is the name the dump uses."""
        frame = _first_caller_outside_torch()
        if frame is None or frame.f_code.co_name != "record_api" or frame.f_lineno not in self.call_lines:
            return None
        name = frame.f_locals.get("prefix_api")
        return name if isinstance(name, str) else None

    def quiet(self) -> AbstractContextManager[object]:
        return nullcontext()

    @contextmanager
    def session(self, dump_dir: Path, task: str, summary_mode: str, level: str = "L1") -> Iterator[None]:
        self.debugger.reset()
        body: dict[str, Any] = {"task": task, "dump_path": str(dump_dir), "level": level, "step": [0]}
        if task == "statistics":
            body["statistics"] = {"summary_mode": summary_mode}
        self.debugger(_write_config(dump_dir, body))
        try:
            yield
            self.debugger.step()
        finally:
            self.debugger.drain()
            self.debugger.reset()

    def start(self, model: nn.Module | None = None) -> None:
        self.debugger.start(model)

    def stop(self) -> None:
        self.debugger.stop()


class MsprobeDumper:
    """msprobe 8.3.3's own ``PrecisionDebugger`` (run in msprobe's venv). It wraps every API in a module
    (``ApiTemplate``) whose ``forward`` runs the original function; calls made inside an API are not dumped,
    and its hook manager's per-thread ``inner_switch`` turns its hooks off (its own work runs so), which
    keeps the fault's gradient work in backward out of the dump as well."""

    name = "msprobe"

    def __init__(self) -> None:
        from msprobe.core.hook_manager import BaseHookManager
        from msprobe.pytorch import PrecisionDebugger

        self.switch, self.depth = BaseHookManager.inner_switch, BaseHookManager.inner_api_count
        self.debugger_type = PrecisionDebugger
        self.debugger: Any = None

    def api_in_flight(self) -> str | None:
        """An API call when the first caller outside torch is the wrapping module's forward (or msprobe's
        Tensor/Distributed forward helper) calling the original function: its ``prefix_api_name`` is
        ``Functional.gelu.``, the dump's counter follows."""
        import threading

        tid = threading.get_ident()
        if self.switch[tid] or self.depth[tid] != 1:  # msprobe's own work, or a call inside an API
            return None
        frame = _first_caller_outside_torch()
        if frame is None or "msprobe" not in frame.f_code.co_filename:
            return None
        wrapper = frame.f_locals.get("self" if frame.f_code.co_name == "forward" else "module")
        name = getattr(wrapper, "prefix_api_name", None)
        return name.rstrip(".") if isinstance(name, str) else None

    @contextmanager
    def quiet(self) -> Iterator[None]:
        import threading

        tid = threading.get_ident()
        before = self.switch[tid]
        self.switch[tid] = True
        try:
            yield
        finally:
            self.switch[tid] = before

    @contextmanager
    def session(self, dump_dir: Path, task: str, summary_mode: str, level: str = "L1") -> Iterator[None]:
        section: dict[str, Any] = {"scope": [], "list": [], "data_mode": ["all"]}
        if task == "statistics":
            section["summary_mode"] = summary_mode
        body = {"task": task, "dump_path": str(dump_dir), "rank": [], "step": [], "level": level,
                "async_dump": False, task: section}  # fmt: skip
        self.debugger = self.debugger_type(config_path=str(_write_config(dump_dir, body)))
        yield
        self.debugger.step()

    def start(self, model: nn.Module | None = None) -> None:
        self.debugger.start(model)

    def stop(self) -> None:
        self.debugger.stop()


def _write_config(dump_dir: Path, body: dict[str, Any]) -> Path:
    dump_dir.parent.mkdir(parents=True, exist_ok=True)
    cfg = dump_dir.parent / f"{dump_dir.name}.config.json"
    cfg.write_text(json.dumps(body))
    return cfg


class Perturb(TorchFunctionMode):
    """Degrades one call (``fault``) and/or every call (``sigma``); see the module docstring."""

    def __init__(self, fault: Fault | None, sigma: float, seed: int, dumper: Dumper,
                 kernel: str | None = None) -> None:  # fmt: skip
        super().__init__()
        if kernel is not None and kernel not in KERNELS:
            raise ValueError(f"unknown kernel variant {kernel!r}; known: {KERNELS}")
        self.fault, self.sigma, self.dumper, self.kernel = fault, sigma, dumper, kernel
        self.counts: dict[str, int] = {}
        self.gen = torch.Generator().manual_seed(seed)  # its own: the run's RNG (dropout) stays in step
        self.hit = False

    def _noise(self, t: torch.Tensor, rel: float) -> torch.Tensor:
        """``t`` scaled in place by ``1 + rel * N(0, 1)``, through ``.data``: the graph keeps the call's own
        node (its backward entry must mean the same on both sides) and no version counter moves."""
        scale = 1 + rel * torch.randn(t.shape, generator=self.gen, dtype=torch.float32).to(t.device, t.dtype)
        t.data.mul_(scale)
        return t

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                           kwargs: dict[str, Any] | None = None) -> Any:  # fmt: skip
        kwargs = kwargs or {}
        name = self.dumper.api_in_flight()
        if name is None:  # the client's own work (copies, statistics) reaches this mode too: left alone
            return func(*args, **kwargs)
        with self.dumper.quiet():
            return self._call(name, func, args, kwargs)

    def _call(self, name: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        k = self.counts.get(name, 0)
        self.counts[name] = k + 1
        fault = self.fault if self.fault and self.fault.api == name and self.fault.index == k else None
        if fault is not None:
            self.hit = True
        out = func(*args, **kwargs)
        op = name.split(".")[1] if "." in name else name
        other = self.kernel is not None and op in REDUCTION_OPS
        replica = self._other_kernel(op, func, args, kwargs, out) if other else None
        if fault is not None and not fault.backward:
            # Computed apart and copied into the call's own output, so its autograd node stays the real one.
            with torch.no_grad():
                degraded = list(_float_tensors(self._degraded(fault.kind, func, args, kwargs)))
            for t, d in zip(_float_tensors(out), degraded, strict=True):
                t.data.copy_(d)
        if self.sigma > 0:
            for t in _float_tensors(out):
                self._noise(t, self.sigma)
        grad_fn = next((t.grad_fn for t in _float_tensors(out) if t.grad_fn is not None), None)
        if grad_fn is not None and replica is not None:
            self._hook_replica(grad_fn, replica, op in MATMUL_OPS and self.kernel == "tf32")
        if grad_fn is not None and (self.sigma > 0 or (fault is not None and fault.backward)):
            kind = fault.kind if fault is not None and fault.backward else None
            grad_fn.register_hook(self._grad_hook(kind))
        return out

    def _other_kernel(self, op: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                      out: Any) -> Any:  # fmt: skip
        """Recompute a reduction as another device's kernel (float64, TF32 operands for the matmul class),
        copy the result, rounded back, into the call's own outputs, and return the float64 replica's autograd
        node (None when it has none) for the backward."""
        tf32 = self.kernel == "tf32" and op in MATMUL_OPS

        def replica(t: torch.Tensor) -> torch.Tensor:
            d = round_tf32(t.detach()) if tf32 else t.detach().double()
            return d.requires_grad_(t.requires_grad)

        with torch.enable_grad():
            wide_kwargs = {k: _map_floats(v, replica) for k, v in kwargs.items()}
            wide = func(*_map_floats(args, replica), **wide_kwargs)
        for t, w in zip(_float_tensors(out), _float_tensors(wide), strict=True):
            t.data.copy_(w.detach().to(t.dtype))
        return next((w.grad_fn for w in _float_tensors(wide) if w.grad_fn is not None), None)

    def _hook_replica(self, real: Any, wide: Any, tf32: bool) -> None:
        """Hook every autograd node of the call's own backward with its replica's node, walking the real
        graph and the replica's side by side from the output's node down to the replica's leaves (its
        inputs), so the whole backward is the other kernel's. Real TF32 rounds a GEMM's operands only
        (``GEMM_NODES``): the view around a 3-D ``linear``'s ``addmm`` hands on its gradient exactly, the
        ``addmm`` under it rounds it. A node whose replica differs (another name or arity: CPU float32's
        fused LSTM against float64's unfused one) is left exact, with what lies below it."""
        seen: set[int] = set()
        stack = [(real, wide)]
        while stack:
            r, w = stack.pop()
            if r is None or w is None or id(r) in seen or w.name() == "torch::autograd::AccumulateGrad":
                continue
            seen.add(id(r))
            if r.name() != w.name() or len(r.next_functions) != len(w.next_functions):
                continue
            r.register_hook(self._replica_hook(w, tf32 and r.name() in GEMM_NODES))
            below = zip(r.next_functions, w.next_functions, strict=True)
            stack.extend((rf, wf) for (rf, _), (wf, _) in below)

    def _replica_hook(self, node: Any, tf32: bool) -> Callable[[Any, Any], Any]:
        """A node hook handing upstream the gradients the float64 replica's node computes from the same
        incoming gradients (rounded to TF32 where the node is a GEMM under TF32), each rounded back to its
        dtype. A node whose gradients do not line up (None where the replica needs one) is left exact."""

        def hook(grad_inputs: Any, grad_outputs: Any) -> Any:
            if any(g is None for g in grad_outputs):
                return None
            with self.dumper.quiet(), torch.no_grad():
                wide = node(*(round_tf32(g) if tf32 else g.double() for g in grad_outputs))
                wide = wide if isinstance(wide, tuple) else (wide,)
                if len(wide) != len(grad_inputs):
                    return None
                return tuple(g if g is None or w is None or w.shape != g.shape else w.to(g.dtype)
                             for g, w in zip(grad_inputs, wide, strict=True))  # fmt: skip

        return hook

    def _grad_hook(self, kind: str | None) -> Callable[[Any, Any], Any]:
        def hook(grad_inputs: Any, grad_outputs: Any) -> Any:
            with self.dumper.quiet():
                return tuple(degrade(g) if isinstance(g, torch.Tensor) and g.is_floating_point() else g
                             for g in grad_inputs)  # fmt: skip

        def degrade(g: torch.Tensor) -> torch.Tensor:
            # New tensors, never in place: a view's backward hands on a view of its incoming gradient,
            # which the capture records as the call's backward input.
            if kind == "bwd-fp16":
                g = g.half().to(g.dtype)
            elif kind == "bwd-noise-1e-3":
                g = self._noise(g.clone(), 1e-3)
            return self._noise(g.clone(), self.sigma) if self.sigma > 0 else g

        return hook

    def _degraded(self, kind: str, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The call's result as the faulty kernel computes it (run under ``no_grad``)."""
        if kind in ("fp16", "bf16"):
            low = torch.float16 if kind == "fp16" else torch.bfloat16
            return func(*_map_floats(args, lambda t: t.to(low)), **_map_floats(kwargs, lambda t: t.to(low)))
        if kind == "eps":
            return func(*args, **{**kwargs, "eps": 1e-2})
        if kind == "no-bias":
            if len(args) > 2:
                args = (*args[:2], None, *args[3:])
            return func(*args, **{**kwargs, "bias": None} if "bias" in kwargs else kwargs)
        out = _map_floats(func(*args, **kwargs), lambda t: t.clone())
        if kind.startswith("noise-"):
            rel = float(kind.split("-", 1)[1])
            return _map_floats(out, lambda t: self._noise(t, rel))
        if kind in ("nan", "inf"):
            for t in _float_tensors(out):
                t.view(-1)[t.numel() // 2] = float(kind)
            return out
        raise ValueError(f"unknown fault kind {kind!r}")


# ------------------------------------------------------------------------------------------------------
# running


_DUMPERS: dict[str, Callable[[], Dumper]] = {"parity": ParityDumper, "msprobe": MsprobeDumper}
_dumper_cache: dict[str, Dumper] = {}


def dump_run(dump_dir: Path, family: str, *, task: str = "tensor", fault: Fault | None = None,
             sigma: float = 0.0, seed: int = 0, summary_mode: str = "statistics",
             dumper: str = "parity", kernel: str | None = None, device: str = "cpu",
             tf32: bool = False) -> Path:  # fmt: skip
    """One training step of ``family`` dumped into ``dump_dir`` by ``dumper`` (``parity``, or ``msprobe``
    in msprobe's own interpreter), computed by ``kernel`` (None: the device's own; ``KERNELS``) on ``device``
    (with TF32 matmuls and convolutions when ``tf32``, on a GPU); returns the rank directory's dump.json."""
    tool = _dumper_cache.get(dumper) or _dumper_cache.setdefault(dumper, _DUMPERS[dumper]())
    perturb = Perturb(fault, sigma, seed, tool, kernel)
    model, x, y = build(family)
    if device != "cpu":
        model, x, y = model.to(device), x.to(device), y.to(device)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
    with tool.session(dump_dir, task, summary_mode):
        with perturb:  # entered first: below a capture mode, so the capture sees its outputs
            tool.start()
            train_step(model, x, y)
            tool.stop()
    if fault is not None and not perturb.hit:
        raise RuntimeError(f"{fault.label}: the faulty call never ran")
    found = sorted(dump_dir.glob("step0/*/dump.json"))
    if not found:
        raise RuntimeError(f"{dump_dir}: no dump written")
    return found[0]


def noise_sigma(rng: random.Random) -> float:
    """A relative noise level log-uniform in [1e-6, 1e-4]."""
    return 10.0 ** rng.uniform(-6.0, -4.0)


@dataclass
class Outcome:
    """One compared pair: the ranked suspects, the first divergence, and every judged call's score."""

    label: str
    mode: str
    variant: str  # "clean", "noisy", or the target's kernel ("f64", "tf32", "cuda")
    truth: str | None  # None: a pair with no fault (identical or noise-only)
    ranked: list[str]
    first: str | None
    scores: dict[str, float] = field(default_factory=dict)

    #: the systematic findings the pair reported (the engine's ``Localization.systematic``, in words)
    systematic: list[str] = field(default_factory=list)
    #: every right answer, where a fault is more than one call (``hf_suite``'s truth sets); else ``truth``
    answers: frozenset[str] = frozenset()
    #: per ranked suspect, the target calls it stands for (a gap judged as one call: all of them)
    named_calls: list[frozenset[str]] = field(default_factory=list)
    #: the target calls the first divergence stands for (empty: ``first`` alone)
    first_calls: frozenset[str] = frozenset()

    @property
    def noisy(self) -> bool:
        """A pair whose target is not the bench's own computation (noise, or another kernel)."""
        return self.variant != "clean"

    @property
    def right(self) -> frozenset[str]:
        """The entries that are right answers: the truth set, or the faulty call alone."""
        if self.answers:
            return self.answers
        return frozenset() if self.truth is None else frozenset({self.truth})

    def hit(self, k: int) -> bool:
        """Whether the ``k``-th suspect (0-based) is a right answer (a gap: if a call in it is)."""
        calls = self.named_calls[k] if k < len(self.named_calls) else frozenset()
        return bool((calls or {self.ranked[k]}) & self.right)

    @property
    def top1(self) -> bool:
        return bool(self.ranked) and self.hit(0)

    @property
    def top3(self) -> bool:
        return any(self.hit(k) for k in range(min(3, len(self.ranked))))

    @property
    def first_hit(self) -> bool:
        """Whether the first divergence is a right answer."""
        return self.first is not None and bool((self.first_calls or {self.first}) & self.right)

    @property
    def false_alarm(self) -> bool:
        return self.truth is None and bool(self.ranked)


def compare(target: Path, bench: Path) -> tuple[list[str], str | None, dict[str, float]]:
    """The engine's ranked suspects, first divergence and per-call scores for one pair."""
    ranked, first, scores, _ = judged(target, bench)
    return ranked, first, scores


def judged(target: Path, bench: Path) -> tuple[list[str], str | None, dict[str, float], list[str]]:
    """``compare``'s three, and the systematic findings the pair reported (in words)."""
    j = judgement(target, bench)
    return j.ranked, j.first, j.scores, j.systematic


@dataclass
class Judgement:
    """What the engine said of one pair: the ranked suspects (and the target calls each stands for: a gap
    judged as one call is all of its calls), the first divergence, every judged call's score, and the
    systematic findings in words."""

    ranked: list[str]
    named_calls: list[frozenset[str]]
    first: str | None
    first_calls: frozenset[str]
    scores: dict[str, float]
    systematic: list[str]


def judgement(target: Path, bench: Path) -> Judgement:
    """The engine's verdict on one pair (``compare_dumps`` with its default options)."""
    from parity.shared.compare.engine import compare_dumps
    from parity.shared.compare.options import CompareOptions

    result = compare_dumps(target, bench, CompareOptions())
    scores: dict[str, float] = {}
    for row, score in zip(result.rows, result.row_scores or [], strict=False):
        if score is not None:
            scores[row.api] = score
    order: list[str] = []
    if any(s.gap for s in [*result.suspects, result.first_divergence] if s is not None):
        order = list(json.loads(target.read_text())["data"])
    calls = [_stands_for(s.api, s.gap, order) for s in result.suspects]
    first = result.first_divergence
    first_calls = _stands_for(first.api, first.gap, order) if first else frozenset()
    ranked = [s.api for s in result.suspects]
    systematic = [f.text for f in result.systematic]
    return Judgement(ranked, calls, first.api if first else None, first_calls, scores, systematic)


def _stands_for(api: str, gap: str | None, order: list[str]) -> frozenset[str]:
    """The target calls a suspect stands for: itself, or a gap's target calls from its first to its last
    (the gap's label, ``target A ... C ~ bench B``, names them by those two; the dump's order fills in)."""
    if not gap or not gap.startswith("target "):
        return frozenset({api})
    span = gap[len("target ") :].split(" ~ bench ", 1)[0]
    first, _, last = span.partition(" ... ")
    if first not in order or (last and last not in order):
        return frozenset({api})
    start = order.index(first)
    stop = order.index(last) if last else start
    return frozenset(order[start : stop + 1]) | {api}


def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="parity-loc-"))


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
