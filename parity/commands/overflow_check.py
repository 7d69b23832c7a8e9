"""``parity overflow-check -i STEP_DIR [-o OUT]``: the first call to make NaN/Inf, across a step.

msprobe 26's ``msprobe overflow_check -i dump/step0 [-o ./output]``, with its arguments, its search and its
output (``anomaly_analyze_{time_ns}.json`` under ``-o``; nothing written when no call overflowed): see
``parity.shared.dump.overflow_check``. Each call found is also printed, with the rank, and whether it came
before the first collective, at one, or after the last.

Exit codes: 0 whether or not a call overflowed (as msprobe); 2 for a missing or malformed dump, one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-i",
        "--input_path",
        "--input-path",
        dest="input_path",
        required=True,
        type=Path,
        metavar="STEP_DIR",
        help="the step folder of a statistics dump, e.g. dump/step0",
    )
    parser.add_argument("-o", "--output_path", "--output-path", dest="output_path", type=Path,
                        default=Path("./output"), metavar="OUT",
                        help="where anomaly_analyze_{ts}.json is written (default: ./output)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from parity.shared.dump.overflow_check import find_overflow, write_anomaly_analyze

    result = find_overflow(args.input_path)
    out = sys.stdout
    if not result.anomalies:
        out.write(f"overflow-check: no call made NaN/Inf in {args.input_path} ({len(result.ranks)} ranks); "
                  "nothing written\n")  # fmt: skip
        return 0
    for anomaly in result.anomalies:
        out.write(f"rank {anomaly.call.rank}: {anomaly.call.name} ({anomaly.phase})\n")
    path = write_anomaly_analyze(result, args.output_path)
    out.write(f"overflow-check: written {path}\n")
    return 0
