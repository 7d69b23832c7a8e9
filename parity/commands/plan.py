"""``parity plan COMPARISON_ID|compare_summary.json -o config.json [--top N] [--neighbours K]``: the next
dump's plan.

Statistics first, then only the suspects in tensor mode: the config.json written is msprobe's (task
``tensor``, ``list`` naming the suspects' entries and, with ``--neighbours``, the calls that fed them or read
their outputs; the step and ranks where the runs diverged), so msprobe 8.3.3 runs it unchanged, and it
carries ``parity_statistics_for_all`` for Parity's client: every call keeps its statistics, only the listed
ones get tensor files. A comparison id is planned by the server (``GET /comparisons/{id}/plan``); a summary
file here, with its dump for the neighbours. Exit 1, and nothing written, when the comparison has no
suspects; exit 2 for an unknown id, a summary of another format or a comparison not finished.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from parity.commands import server_args
from parity.shared.dump.layout import DUMP_JSON
from parity.shared.plan import DEFAULT_NEIGHBOURS, DEFAULT_TOP, PlanError, make_plan
from parity.shared.plan.builder import DEFAULT_DUMP_PATH

EXIT_NO_SUSPECTS = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", metavar="COMPARISON_ID|SUMMARY",
                        help="a comparison id on the server, or a compare_summary*.json file")  # fmt: skip
    parser.add_argument("-o", "--output", type=Path, required=True, help="the config.json to write")
    parser.add_argument("--top", type=int, default=DEFAULT_TOP,
                        help=f"suspects to list (default: {DEFAULT_TOP})")
    parser.add_argument("--neighbours", "--neighbors", type=int, default=DEFAULT_NEIGHBOURS, metavar="K",
                        help="also list the calls within K data-flow steps of a suspect "
                             f"(default: {DEFAULT_NEIGHBOURS}; 0: the suspects alone)")  # fmt: skip
    parser.add_argument("--step", type=int, default=None,
                        help="a summary file: the step to dump (default: the compared one, from its paths)")
    parser.add_argument("--dump-path", default=DEFAULT_DUMP_PATH,
                        help=f"dump_path of the config (default: {DEFAULT_DUMP_PATH})")  # fmt: skip
    server_args.add_server_arguments(parser)


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise PlanError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path}: the {what} is not JSON: {exc}") from None


def _dump_loader(summary_path: Path) -> Any:
    """The target dump.json a summary names (as written, or beside the summary when it was moved)."""

    def load(_rank: int | None, npu_path: str | None) -> Mapping[str, Any] | None:
        if not npu_path:
            return None
        for candidate in (Path(npu_path), summary_path.parent / npu_path):
            found = candidate / DUMP_JSON if candidate.is_dir() else candidate
            if found.is_file():
                doc = _read_json(found, "dump.json")
                return doc if isinstance(doc, dict) else None
        return None

    return load


#: How a server names the dumps of its comparisons in a summary (``target run ID: step0``).
_SERVER_SIDE = re.compile(r"^target run (\w+): step(\d+)")


def _from_summary(args: argparse.Namespace, path: Path) -> tuple[dict[str, Any] | None, list[Any], list[str]]:
    summary = _read_json(path, "compare summary")
    if isinstance(summary, dict) and isinstance(summary.get("comparison"), str):
        # Saved by ``compare-runs --wait``: its dumps, level and steps are on the server that compared them.
        args.source = summary["comparison"]
        args.server = args.server or summary.get("server")
        return _from_server(args)
    side = _SERVER_SIDE.match(str(summary.get("npu_path") or "")) if isinstance(summary, dict) else None
    if side is not None:
        raise PlanError(f"{path}: a server's summary (its dumps are on the server, run {side[1]}): plan its "
                        "comparison there: parity plan COMPARISON_ID --server URL")  # fmt: skip
    try:
        plan = make_plan(summary, top=args.top, neighbours=args.neighbours, step=args.step,
                         load_dump=_dump_loader(path))  # fmt: skip
    except PlanError as exc:
        raise PlanError(f"{path}: {exc}") from None
    config = plan.config(args.dump_path) if plan.calls else None
    return config, [(c.api, c.rank, c.role, c.score) for c in plan.calls], plan.notes


def _from_server(args: argparse.Namespace) -> tuple[dict[str, Any] | None, list[Any], list[str]]:
    with server_args.connect(args) as api:
        plan = api.get_plan(args.source, top=args.top, neighbours=args.neighbours)
    config = dict(plan.config) if plan.config is not None else None
    if config is not None:
        config["dump_path"] = args.dump_path
    return config, [(c.api, c.rank, c.role, c.score) for c in plan.calls], plan.notes


def _lines(calls: Sequence[tuple[str, int | None, str, float | None]]) -> list[str]:
    out = []
    for api, rank, role, score in calls:
        where = f" (rank {rank})" if rank is not None else ""
        figure = f", score {score:.1f}" if score is not None else ""
        out.append(f"  {role}: {api}{where}{figure}")
    return out


def run(args: argparse.Namespace) -> int:
    path = Path(args.source)
    source_is_file = path.is_file() or args.source.endswith(".json")
    config, calls, notes = _from_summary(args, path) if source_is_file else _from_server(args)
    what = f"summary {path}" if source_is_file else f"comparison {args.source}"
    if config is None:
        why = "; ".join(notes) or "it has no suspects"
        sys.stderr.write(f"parity plan: {what} plans no dump ({why}): nothing written\n")
        return EXIT_NO_SUSPECTS
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    suspects = sum(1 for c in calls if c[2] != "neighbour")
    sys.stdout.write(
        f"wrote {args.output}: {len(config['tensor']['list'])} entries of {len(calls)} calls "
        f"({suspects} suspects, {len(calls) - suspects} neighbours), step {config['step']}, rank "
        f"{config['rank']}, level {config['level']}\n"
    )
    sys.stdout.writelines(f"{line}\n" for line in _lines(calls))
    return 0
