"""Runs whose call traces differ, end to end (``benchmarks/alignment_suite.py``): one training step dumped by
Parity's client at L1, the target fusing attention (its block 1 in bfloat16) against explicit attention;
every call paired as the generator knows it should be, the faulty fused call the top suspect as a gap."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import alignment_suite  # noqa: E402

pytestmark = pytest.mark.slow


def test_fused_attention_pairs_every_call_and_names_the_faulty_gap() -> None:
    faulty, clean = alignment_suite.run_family("attn", ("L1",))
    assert faulty.right == faulty.calls and clean.right == clean.calls, faulty.wrong + clean.wrong
    assert faulty.top1 and faulty.top is not None and faulty.top.startswith(
        "target Functional.scaled_dot_product_attention.1.forward ~ bench ")
    assert clean.named == []  # the fused calls differ by rounding only
