"""``parity replay -i compare.json ENTRY... [--rank N] [--json]``: run recorded calls again on the CPU in
float64 and say which side's kernel is wrong (``parity.shared.replay``).

``compare.json`` is the file ``parity compare -i`` takes. Each ENTRY is a dump entry name
(``Functional.linear.0.forward``, ``Tensor.__add__.2.backward``); step directories need ``--rank``. One line
per entry, ``ENTRY: [verdict] evidence``, or with ``--json`` a JSON array of the verdicts.

Exit codes: 0 when the replays ran, whatever they found (a call that cannot be replayed is a verdict that
says why); 2 for a bad compare.json, an unknown entry or rank, as one ``parity replay: error: ...`` line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-i", "--input_path", "--input-path", dest="input_path", required=True, type=Path,
                        metavar="COMPARE_JSON",
                        help="compare.json naming the target (npu_path) and bench dumps")  # fmt: skip
    parser.add_argument("entries", nargs="+", metavar="ENTRY",
                        help="dump entry names to replay, e.g. Functional.linear.0.forward")  # fmt: skip
    parser.add_argument("--rank", type=int, default=None, metavar="N",
                        help="the rank to replay when compare.json names step directories")  # fmt: skip
    parser.add_argument("--json", dest="as_json", action="store_true", help="print the verdicts as JSON")


def _dump_pair(spec: object, rank: int | None) -> tuple[Path, Path]:
    from parity.shared.compare.job import plan_compare
    from parity.shared.compare.spec import CompareSpec
    from parity.shared.errors import CompareInputError

    assert isinstance(spec, CompareSpec)
    if not spec.multi_rank:
        if rank is not None:
            raise CompareInputError("--rank applies to step directories; compare.json names two dump.json")
        return spec.npu_path, spec.bench_path
    plan = plan_compare(spec)
    ranks = [p.rank for p in plan.pairs]
    if rank is None:
        raise CompareInputError(f"compare.json names step directories: choose a rank with --rank ({ranks})")
    pair = next((p for p in plan.pairs if p.rank == rank), None)
    if pair is None:
        raise CompareInputError(f"--rank {rank}: not a rank of both step directories (ranks: {ranks})")
    return pair.npu_dump, pair.bench_dump


def run(args: argparse.Namespace) -> int:
    """Check the request, replay each entry on both sides, print one verdict per entry."""
    from parity.process_policy import replay_budget, tensor_limits
    from parity.shared.compare.spec import load_compare_spec
    from parity.shared.dump.naming import parse_entry
    from parity.shared.errors import CompareInputError
    from parity.shared.replay.engine import DumpSide
    from parity.shared.replay.sandbox import replay_isolated
    from parity.shared.report.summary import json_safe

    for entry in args.entries:
        if parse_entry(entry) is None:
            raise CompareInputError(f"{entry!r} is not a dump entry name (e.g. Functional.linear.0.forward)")
    spec = load_compare_spec(args.input_path)
    npu_dump, bench_dump = _dump_pair(spec, args.rank)
    known = {**DumpSide("target", npu_dump).data(), **DumpSide("bench", bench_dump).data()}
    unknown = [e for e in args.entries if e not in known]
    if unknown:
        raise CompareInputError(f"{args.input_path}: no entry {', '.join(unknown)} in either dump.json")
    # in a child process: a crash or a runaway kernel loses only that call's verdict
    verdicts = replay_isolated(npu_dump, bench_dump, args.entries, budget=replay_budget(),
                               limits=tensor_limits())  # fmt: skip
    out = sys.stdout
    if args.as_json:
        out.write(json.dumps(json_safe([v.as_dict() for v in verdicts]), indent=2) + "\n")
        return 0
    for v in verdicts:
        out.write(f"{v.entry}: [{v.verdict.value}] {v.text}\n")
    return 0
