"""``parity merge-result -i RESULTS_DIR -o OUT_DIR -config merge.yaml``: chosen APIs x ranks x metrics in one
workbook, from the per-rank compare results of a multi-rank compare (``compare_result_rank{N}_{ts}.xlsx``).

msprobe 26's ``msprobe merge_result``, with its arguments, config and output
(``multi_ranks_compare_merge_{ts}.xlsx``): see ``parity.shared.report.merge_result``.

Exit codes: 0 when the workbook was written; 2 for a missing folder, a bad config or nothing to merge.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-i",
        "--input_dir",
        "--input-dir",
        dest="input_dir",
        required=True,
        type=Path,
        metavar="RESULTS_DIR",
        help="the folder of compare_result_rank{N}_{ts}.xlsx",
    )
    parser.add_argument(
        "-o",
        "--output_dir",
        "--output-dir",
        dest="output_dir",
        required=True,
        type=Path,
        metavar="OUT_DIR",
        help="where multi_ranks_compare_merge_{ts}.xlsx is written",
    )
    parser.add_argument(
        "-config",
        "--config-path",
        "--config_path",
        dest="config_path",
        required=True,
        type=Path,
        metavar="YAML",
        help="the APIs to merge ('api': [...]) and the metrics ('compare_index': [...])",
    )


def run(args: argparse.Namespace) -> int:
    from parity.shared.report.merge_result import load_merge_config, write_merge

    config = load_merge_config(args.config_path)
    path = write_merge(args.input_dir, config, args.output_dir)
    sys.stdout.write(f"merge-result: written {path}\n")
    return 0
