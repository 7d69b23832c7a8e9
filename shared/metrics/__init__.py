"""Accuracy metrics: tensor mode (:mod:`.tensor`, one fused pass per pair) and its parallel executor
(:mod:`.parallel`, a process pool balanced by bytes)."""

from parity.shared.metrics.tensor import TensorMetrics, compare_arrays

__all__ = ["TensorMetrics", "compare_arrays"]
