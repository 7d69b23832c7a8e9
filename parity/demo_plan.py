"""``make demo``'s last step: statistics first, then only the suspects in tensor mode (``parity plan``).

A small GELU MLP trained one step twice in statistics mode, the target with a GELU kernel that is 1e-2 off
(as a faulty device kernel would be); their comparison on the server; its plan (top 10 suspects, neighbours
1); a tensor re-dump of both sides with ``PrecisionDebugger(..., plan=COMPARISON_ID)`` (every call's
statistics, tensor files for the planned calls only); and the tensor comparison, whose top suspect and
float64 replay name the faulty GELU. Each run and comparison is on the server's pages as one chain.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from parity.client.rest import ParityClient
    from parity.shared.contract import ComparisonPublic

__all__ = ["plan_demo"]

PROJECT = "demo-plan"


def _faulty_gelu() -> Callable[..., torch.Tensor]:
    """``F.gelu`` with a 1e-2 relative error, still seen (and named) by the client as ``Functional.gelu``."""
    import torch
    from torch.nn import functional as F

    exact = F.gelu
    torch.overrides.resolve_name(exact)  # torch's name index, built with the real gelu first

    def gelu(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if torch.overrides.has_torch_function((x,)):
            return torch.overrides.handle_torch_function(gelu, (x,), x, *args, **kwargs)  # type: ignore[no-any-return]
        noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(0))
        return exact(x, *args, **kwargs) * (1 + 1e-2 * noise)

    gelu.__module__ = "torch.nn.functional"
    return gelu


def _train(dump_dir: Path, server: str, run_name: str, *, faulty: bool, **debugger: Any) -> None:
    """One step of a GELU MLP under ``PrecisionDebugger`` (uploaded to ``server``), in this process."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    from parity import PrecisionDebugger

    exact = F.gelu
    gelu = _faulty_gelu() if faulty else exact
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    PrecisionDebugger.reset()
    F.gelu = gelu
    try:
        PrecisionDebugger(dump_path=str(dump_dir), server=server, run_name=run_name, project=PROJECT,
                          **debugger)
        PrecisionDebugger.start()
        model(x).pow(2).mean().backward()
        PrecisionDebugger.stop()
        PrecisionDebugger.step()
    finally:
        F.gelu = exact
        PrecisionDebugger.reset()  # uploads what is left and marks the run complete


def _compare(api: ParityClient, target: str, bench: str) -> ComparisonPublic:
    ids = []
    for name in (target, bench):
        deadline = time.monotonic() + 60
        while not (runs := api.find_runs(name=name, project=PROJECT)) or runs[0].status != "complete":
            if time.monotonic() > deadline:
                raise RuntimeError(f"run {name} not complete after 60 s")
            time.sleep(0.2)
        ids.append(runs[0].id)
    info = api.wait_for_comparison(api.create_comparison(ids[0], ids[1]).id, timeout=120)
    if info.status != "succeeded" or info.summary is None:
        raise RuntimeError(f"comparison {info.id} failed: {info.error}")
    return info


def plan_demo(api: ParityClient, server: str, tmp: Path, out_dir: Path, stamp: str, *,
              links: bool = True) -> list[str]:  # fmt: skip
    """The step; returns the lines it prints (``links``: with a link to the page, the server staying up)."""
    names = {k: f"demo-{k}-{stamp}" for k in ("stats-bench", "stats-target", "plan-bench", "plan-target")}
    _train(tmp / "stats-bench", server, names["stats-bench"], faulty=False, task="statistics", level="L1")
    _train(tmp / "stats-target", server, names["stats-target"], faulty=True, task="statistics", level="L1")
    stats = _compare(api, names["stats-target"], names["stats-bench"])
    assert stats.summary is not None
    plan = api.get_plan(stats.id)
    if plan.config is None:
        raise RuntimeError(f"comparison {stats.id} planned no dump: {plan.notes}")
    out_dir.mkdir(parents=True, exist_ok=True)
    config = out_dir / "plan_config.json"
    config.write_text(json.dumps({**plan.config, "dump_path": "./parity_plan_dump"}, indent=2) + "\n")
    for side, faulty in (("bench", False), ("target", True)):
        _train(tmp / f"plan-{side}", server, names[f"plan-{side}"], faulty=faulty, plan=stats.id)
    tensor = _compare(api, names["plan-target"], names["plan-bench"])
    assert tensor.summary is not None
    top = tensor.summary.top_suspects[0].api if tensor.summary.top_suspects else "none"
    replays = [f"{v.entry}: {v.verdict}" for v in tensor.summary.replay[:2]]
    first = stats.summary.top_suspects[0].api if stats.summary.top_suspects else "none"
    return [
        f"plan: statistics runs {names['stats-target']} vs {names['stats-bench']}: comparison {stats.id}, "
        f"{len(stats.summary.top_suspects)} suspects (first {first})",
        f"plan: parity plan {stats.id} -> {config} ({len(plan.config['tensor']['list'])} entries of "
        f"{len(plan.calls)} calls in tensor mode, statistics for the rest)",
        f"plan: tensor re-dump with PrecisionDebugger(plan={stats.id!r}): {names['plan-target']}, "
        f"{names['plan-bench']}",
        f"plan: tensor comparison {tensor.id}: top suspect {top}; float64 replay: {'; '.join(replays)}",
        *([f"plan: the chain on the web page: {server}/comparisons/{tensor.id}"] if links else []),
    ]
