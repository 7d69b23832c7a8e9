"""Float64 replay of recorded calls: which side's kernel is wrong (see :mod:`parity.shared.replay.engine`).

``replay_calls(npu_dump, bench_dump, entries)`` is the entry point; :mod:`~parity.shared.replay.compare`
runs it for a comparison's top suspects and first divergence.
"""
