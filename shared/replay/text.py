"""The replay's lines in the advisor file and ``parity compare``'s output, from the summary's ``replay``
document (plain JSON values: the server and ``parity compare-runs`` format the same lines without torch)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["replay_lines", "verdict_line"]


def verdict_line(verdict: Mapping[str, Any]) -> str:
    """One verdict on one line: ``[target] Functional.gelu.0.forward: target output 7.7e-03 from ...``."""
    text = " ".join(str(verdict.get("text", "")).split())
    return f"[{verdict.get('verdict')}] {verdict.get('entry')}: {text}"


def replay_lines(doc: Mapping[str, Any] | None) -> list[str]:
    """The float64 replay section: a heading and one line per verdict, or the one note saying why there is
    none (statistics mode); nothing when no replay was asked for."""
    if not doc:
        return []
    verdicts = doc.get("verdicts") or []
    note = doc.get("note")
    if not verdicts:
        return [f"Float64 replay: {note}"] if note else []
    lines = ["Float64 replay (each side's recorded output against its own inputs, replayed on the CPU in "
             "float64):"]  # fmt: skip
    lines += [f"- {verdict_line(v)}" for v in verdicts]
    return lines
