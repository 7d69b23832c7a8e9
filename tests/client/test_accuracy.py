"""The dumps find real precision problems: bf16 autocast is flagged, a noisy op is the first suspect."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from parity.shared.compare.engine import compare_dumps
from parity.shared.compare.options import CompareOptions
from parity.shared.compare.result import RowStatus
from torch.nn import functional as F

from tests.client.conftest import dump_once


def _compare(npu: Path, bench: Path):  # type: ignore[no-untyped-def]
    return compare_dumps(npu / "step0/rank0/dump.json", bench / "step0/rank0/dump.json", CompareOptions())


@pytest.mark.parametrize("level", ["L1", "mix"])
def test_bf16_autocast_against_fp32_is_flagged(tmp_path: Path, level: str) -> None:
    def autocast(step: Callable[[], torch.Tensor]) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return step()

    npu = dump_once(tmp_path / "npu", "transformer", level, wrap=autocast)
    bench = dump_once(tmp_path / "bench", "transformer", level)
    result = _compare(npu, bench)
    failing = [r.api for r in result.rows if r.status in (RowStatus.FAIL, RowStatus.WARNING)]
    assert any(api.startswith("Functional.linear.") for api in failing), failing[:10]


@pytest.fixture
def noisy_gelu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """F.gelu with 1e-2 relative noise on its output, still seen (and named) as one Functional.gelu call."""
    orig = F.gelu

    def gelu(input: torch.Tensor, approximate: str = "none") -> torch.Tensor:
        if torch.overrides.has_torch_function_unary(input):
            return torch.overrides.handle_torch_function(gelu, (input,), input, approximate=approximate)
        out = orig(input, approximate=approximate)
        noise = torch.randn(out.shape, generator=torch.Generator().manual_seed(0))
        return out * (1 + 1e-2 * noise)

    gelu.__module__ = "torch.nn.functional"
    monkeypatch.setattr(F, "gelu", gelu)
    yield


def test_perturbed_gelu_is_first_suspect(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # Real-data compare: 1e-2 elementwise noise hardly moves max/min/mean/norm, but it moves cosine and
    # relative error, so the forward output is where the loss is first seen.
    bench = dump_once(tmp_path / "bench", "transformer", "L1", task="tensor")
    request.getfixturevalue("noisy_gelu")
    npu = dump_once(tmp_path / "npu", "transformer", "L1", task="tensor")
    result = _compare(npu, bench)
    assert result.suspects, [r.api for r in result.rows if r.status is not RowStatus.PASS][:10]
    assert result.suspects[0].api == "Functional.gelu.0.forward"
