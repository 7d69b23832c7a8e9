"""``parity check RUN [--baseline NAME] [--project P] [--server URL] [--junit FILE]``: the gate a CI job runs.

It waits for the run (an upload still in flight, its validation) and for its comparison against the baseline
(the project's, or ``--baseline NAME``; queued here when auto-compare did not), then judges every API new,
worse, known or fixed by its error (``parity.shared.report.regressions``, the rule the server's pages show)
and exits **0** when nothing is new or worse, **1** when something is, **2** on an error (a run that is
invalid, a comparison that failed, no baseline, a server that does not answer). The new and worse APIs are
printed first, one line each with the error before and after and the line of the user's code that called
it; a last line says what was checked against what. ``--junit FILE`` writes a JUnit XML report (one failing
test case per new or worse API, a passing one per known or fixed API), which CI systems show natively; on
an error it holds one test case in error, so the report says why the gate did not pass.

The same on two local dumps, no server: ``parity check TARGET --baseline BENCH`` where both are dump
folders or files (a ``dump.json``, its rank folder, or a step folder of ``rank*``). It runs ``parity
compare`` into ``-o OUT`` (``./parity-check``) and writes ``check_summary.json`` there with each API's
error; ``--previous`` an earlier check's ``check_summary.json`` judges against it as the server judges
against the previous comparison (without it, every failing API is new: there is no history to know it by).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from parity.client.errors import ClientError
from parity.shared.contract import ApiVerdict, RegressionsPublic, RunPublic
from parity.shared.numbers import prose_number

EXIT_CLEAN = 0
EXIT_REGRESSED = 1
EXIT_ERROR = 2

#: What a gate fails on.
FAILING = ("new", "worse")
#: The local check's own summary, beside the compare's reports.
CHECK_SUMMARY = "check_summary.json"
CHECK_FORMAT_VERSION = 1
#: Run states an upload passes through before it can be compared.
_NOT_YET = ("uploading", "validating")
_POLL_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from parity.commands import server_args

    parser.add_argument("run", metavar="RUN",
                        help="run id or name on the server; or a local dump (dump.json, rank or step folder)")
    parser.add_argument("--baseline", metavar="NAME", default=None,
                        help="the run to check against (default: the project's baseline); with a local RUN, "
                             "the local dump to compare with (required)")  # fmt: skip
    parser.add_argument("--project", default=None, help="project to look run names up in")
    server_args.add_server_arguments(parser)
    parser.add_argument("--junit", type=Path, default=None, metavar="FILE", help="write a JUnit XML report")
    parser.add_argument("--timeout", type=float, default=1800.0,
                        help="seconds to wait in all for the run and its comparison (default: 1800)")
    parser.add_argument("--limit", type=int, default=50,
                        help="new and worse APIs printed (default: 50; the JUnit file has every one)")
    parser.add_argument("-o", "--output", type=Path, default=Path("parity-check"),
                        help="local dumps: folder for the compare's reports and check_summary.json "
                             "(default: ./parity-check)")  # fmt: skip
    parser.add_argument("--previous", type=Path, default=None, metavar="CHECK_SUMMARY",
                        help="local dumps: an earlier check's check_summary.json to judge against")


@dataclass
class Checked:
    """What a check judged: ``target`` against ``bench`` (names as printed), the verdicts, and where the
    reader finds more (the comparison's page, or the local reports' folder)."""

    target: str
    bench: str
    regressions: RegressionsPublic
    where: str
    project: str = "local"
    warnings: list[str] = field(default_factory=list)  # a side of a step cut short, ...


def run(args: argparse.Namespace) -> int:
    from parity.errors import user_error_types

    if args.limit < 1:
        raise ClientError(f"--limit: {args.limit} lists nothing; give 1 or more")
    try:
        checked = check_local(args) if is_local(args) else check_server(args)
    except user_error_types() as exc:
        if args.junit is not None:
            write_junit(args.junit, None, error=f"{exc}", name=args.run)
        raise
    sys.stderr.writelines(f"parity check: warning: {w}\n" for w in checked.warnings)
    sys.stdout.writelines(f"{line}\n" for line in check_lines(checked, limit=args.limit))
    if args.junit is not None:
        write_junit(args.junit, checked)
        sys.stderr.write(f"parity check: wrote {args.junit}\n")
    return EXIT_REGRESSED if failing(checked.regressions) else EXIT_CLEAN


def failing(r: RegressionsPublic) -> list[ApiVerdict]:
    """The APIs a gate fails on: new and worse, in the order listed (execution order within each)."""
    return [v for v in r.data if v.verdict in FAILING]


# -- lines and JUnit --------------------------------------------------------------------------------------
def verdict_line(v: ApiVerdict) -> str:
    """``WORSE Functional.gelu.1.forward: 0.0039 -> 0.051 (13x; ...) at File "train.py", line 20, ...``."""
    before = "-" if v.before is None else prose_number(v.before)
    after = "-" if v.after is None else prose_number(v.after)
    at = f"  at {v.stack}" if v.stack else ""
    return f"{v.verdict.upper():<5} {v.api}: {before} -> {after}; {v.reason}{at}"


def check_lines(checked: Checked, *, limit: int) -> list[str]:
    """The new and worse APIs first, one line each, then one line saying what was checked and the verdict."""
    r = checked.regressions
    bad = failing(r)
    lines = [verdict_line(v) for v in bad[:limit]]
    if len(bad) > limit:
        lines.append(f"... and {len(bad) - limit} more new or worse APIs (--limit N lists more)")
    since = (f"against the previous comparison {r.previous_comparison}" if r.previous_comparison
             else "no earlier comparison: every failing API is new")  # fmt: skip
    counts = f"{r.worse} worse, {r.new} new, {r.known} known, {r.fixed} fixed"
    word = "FAIL" if bad else "PASS"
    what = "something is new or worse" if bad else "nothing new or worse"
    rule = f"worse: {r.metric} beyond {prose_number(r.worse_factor)}x"
    lines.append(f"parity check: {word}: {checked.target} against {checked.bench}: {what} ({counts}; "
                 f"{since}; {rule}); {checked.where}")  # fmt: skip
    return lines


def write_junit(path: Path, checked: Checked | None, *, error: str | None = None, name: str = "") -> None:
    """A JUnit XML report: one test case per API (failing for new and worse, passing for known and fixed),
    or, on an error, one test case in error saying why the check could not judge."""
    from parity.shared.report import write_text_atomically

    suite_name = f"parity check {checked.target} against {checked.bench}" if checked else \
        f"parity check {name}"  # fmt: skip
    suites = ET.Element("testsuites", name="parity check")
    suite = ET.SubElement(suites, "testsuite", name=suite_name,
                          timestamp=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S"))  # fmt: skip
    cases = failures = errors = 0
    if checked is None:
        case = ET.SubElement(suite, "testcase", classname="parity.check", name=name or "parity check")
        ET.SubElement(case, "error", type="error", message=error or "error").text = error
        cases, errors = 1, 1
    else:
        if checked.warnings:
            ET.SubElement(suite, "system-err").text = "\n".join(f"warning: {w}" for w in checked.warnings)
        props = ET.SubElement(suite, "properties")
        for key, value in (("target", checked.target), ("baseline", checked.bench), ("see", checked.where)):
            ET.SubElement(props, "property", name=key, value=value)
        classname = f"parity.{checked.project}"
        for v in checked.regressions.data:
            case = ET.SubElement(suite, "testcase", classname=classname, name=v.api)
            text = "\n".join(x for x in (v.reason, f"at {v.stack}" if v.stack else "") if x)
            if v.verdict in FAILING:
                before = "-" if v.before is None else prose_number(v.before)
                after = "-" if v.after is None else prose_number(v.after)
                message = f"{v.verdict}: {v.api}: {before} -> {after}"
                ET.SubElement(case, "failure", type=v.verdict, message=message).text = text
                failures += 1
            else:
                ET.SubElement(case, "system-out").text = f"{v.verdict}: {text}"
            cases += 1
        if not cases:  # nothing failing at all: one passing case, so the report is not an empty one
            ET.SubElement(suite, "testcase", classname=classname, name=f"{checked.target} against "
                          f"{checked.bench}")  # fmt: skip
            cases = 1
    for element in (suites, suite):
        element.set("tests", str(cases))
        element.set("failures", str(failures))
        element.set("errors", str(errors))
    ET.indent(suites)
    body = ET.tostring(suites, encoding="unicode")
    write_text_atomically(path, f'<?xml version="1.0" encoding="UTF-8"?>\n{body}\n')


# -- on a server ------------------------------------------------------------------------------------------
def is_local(args: argparse.Namespace) -> bool:
    """Local dumps when RUN is a path on disk (a run name never holds ``/``, and is looked up on the server
    unless a file or folder of that name is here)."""
    if not Path(args.run).exists():
        if "/" in args.run:
            raise ClientError(f"{args.run}: no such file or folder (a run name holds no '/')")
        return False
    if args.baseline is None or not Path(args.baseline).exists():
        raise ClientError(f"{args.run} is a local dump: --baseline must name the local dump to compare it "
                          f"with ({args.baseline or 'not given'} is no file or folder here)")  # fmt: skip
    return True


def check_server(args: argparse.Namespace) -> Checked:
    from parity.client.rest import ApiError
    from parity.commands import server_args

    deadline = time.monotonic() + args.timeout
    with server_args.connect(args) as api:
        run = _arrived(api, api.resolve_run(args.run, project=args.project), deadline)
        bench = _baseline(api, run, args)
        if bench.id == run.id:
            raise ClientError(f"run {run.id} ({run.name}) is the baseline itself: nothing to check it "
                              "against")  # fmt: skip
        c = _comparison(api, run, bench, deadline)
        if c.status not in ("succeeded", "failed"):
            sys.stderr.write(f"parity check: comparison {c.id} {c.status}; waiting\n")
            c = api.wait_for_comparison(c.id, timeout=max(0.0, deadline - time.monotonic()))
        if c.status != "succeeded":
            raise ClientError(f"comparison {c.id} of {run.name} against {bench.name} failed: "
                              f"{c.error or 'no reason given'}")  # fmt: skip
        try:
            regressions = api.regressions(c.id)
        except ApiError as exc:
            if exc.status_code == 404:
                raise ClientError(f"{api.server} judges no regressions (an older Parity server)") from None
            raise
        where = f"{api.server}/comparisons/{c.id}"
    warnings = [f"the {side} run {r.name}'s {prefix} is of a step cut short (the process raised or died "
                "before step()): compared as it is, not as a whole step"
                for side, r in (("target", run), ("bench", bench))
                for prefix in r.incomplete_in(c.step, c.ranks)]  # fmt: skip
    return Checked(f"{run.project}/{run.name}", f"{'baseline ' if bench.baseline else ''}{bench.project}/"
                   f"{bench.name}", regressions, where, run.project, warnings)  # fmt: skip


def _arrived(api: Any, run: RunPublic, deadline: float) -> RunPublic:
    """``run`` once uploaded and validated (``complete``); an ``invalid`` run is an error with its reason."""
    said = False
    while run.status in _NOT_YET:
        if time.monotonic() >= deadline:
            raise ClientError(f"run {run.id} ({run.name}) is still {run.status} (--timeout)")
        if not said:
            sys.stderr.write(f"parity check: run {run.name} is {run.status}; waiting\n")
            said = True
        time.sleep(_POLL_S)
        run = api.get_run(run.id)
    if run.status != "complete":
        raise ClientError(f"run {run.id} ({run.name}) is {run.status}: {run.error or 'no reason given'}")
    return run


def _baseline(api: Any, run: RunPublic, args: argparse.Namespace) -> RunPublic:
    """The run to check against: ``--baseline`` (looked up in the run's project), else the project's."""
    if args.baseline is not None:
        bench: RunPublic = api.resolve_run(args.baseline, project=args.project or run.project)
        return bench
    found, _ = api.list_runs(name=run.name, project=run.project, verdicts=True)
    verdict = next((r.verdict for r in found if r.id == run.id and r.verdict is not None), None)
    if verdict is not None and verdict.baseline_run is not None:
        bench = api.get_run(verdict.baseline_run)
        return bench
    if verdict is None:  # a server that does not judge verdicts: look for the baseline among the runs
        for other in api.find_runs(project=run.project):
            if other.baseline:
                return other  # type: ignore[no-any-return]
    raise ClientError(f"project {run.project!r} has no baseline: parity runs baseline NAME --project "
                      f"{run.project} sets one, or --baseline NAME names the run to check "
                      "against")  # fmt: skip


def _comparison(api: Any, run: RunPublic, bench: RunPublic, deadline: float) -> Any:
    """The run's newest comparison against ``bench`` (the one auto-compare queued), queued here when there
    is none (the same request the server makes: it never makes a second); a read-only token waits for
    auto-compare instead."""
    from parity.client.rest import ApiError

    while True:
        mine = [c for c in _comparisons_of(api, run.id) if c.target_run == run.id and c.bench_run == bench.id]
        if mine:
            return max(mine, key=lambda c: (c.against_baseline, c.created_at))
        try:
            return api.create_comparison(run.id, bench.id)
        except ApiError as exc:
            if exc.status_code != 403:
                raise
        if time.monotonic() >= deadline:
            raise ClientError(f"no comparison of {run.name} against {bench.name}, and this token may not "
                              "queue one (read-only): give a read-write token")  # fmt: skip
        time.sleep(_POLL_S)


def _comparisons_of(api: Any, run_id: str) -> list[Any]:
    found: list[Any] = []
    while True:
        page, total = api.list_comparisons(run=run_id, limit=200, offset=len(found))
        found += page
        if not page or len(found) >= total:
            return found


# -- on two local dumps -----------------------------------------------------------------------------------
def check_local(args: argparse.Namespace) -> Checked:
    """Compare the two local dumps (``parity compare``'s pipeline), judge each API against ``--previous``."""
    from parity.process_policy import collector_paused, metric_executor, tensor_limits
    from parity.shared.compare.job import run_compare
    from parity.shared.compare.options import CompareOptions
    from parity.shared.compare.spec import parse_compare_spec
    from parity.shared.report.regressions import judge_apis

    before_errors: dict[str, float | None] = {}
    before_failing: list[str] = []
    if args.previous is not None:  # read first: a wrong file is an error before minutes of compare
        before_errors, before_failing = read_previous(args.previous)
    spec = parse_compare_spec({"npu_path": str(_dump_path(Path(args.run))),
                               "bench_path": str(_dump_path(Path(args.baseline)))},
                              source="parity check")  # fmt: skip
    with collector_paused(), metric_executor(None) as executor:
        options = CompareOptions(executor=executor, tensor_limits=tensor_limits())
        outputs = run_compare(spec, args.output, options)
    errors, failing_now, order, stacks = local_errors(outputs.results)
    regressions = judge_apis(failing_now, errors, before_failing, before_errors, order=order, stacks=stacks,
                             previous_comparison=str(args.previous) if args.previous else None)  # fmt: skip
    doc = {
        "format_version": CHECK_FORMAT_VERSION, "kind": "parity-check", "target": str(args.run),
        "bench": str(args.baseline), "summary": outputs.summary.name if outputs.summary else None,
        "apis": {api: {"error": errors.get(api), "failing": api in set(failing_now)}
                 for api in sorted(order, key=order.__getitem__)},
        "regressions": regressions.model_dump(mode="json"),
    }  # fmt: skip
    from parity.shared.report.summary import write_summary

    summary = write_summary(doc, Path(args.output) / CHECK_SUMMARY)
    where = f"reports in {args.output} ({summary.name})"
    from parity.shared.incomplete import incomplete_lines

    warnings = incomplete_lines(outputs.results)
    return Checked(str(args.run), str(args.baseline), regressions, where, warnings=warnings)


def _dump_path(path: Path) -> Path:
    """A rank folder as its dump.json (compare.json takes a dump.json or a step folder of ``rank*``)."""
    return path / "dump.json" if path.is_dir() and (path / "dump.json").is_file() else path


def local_errors(results: list[Any]) -> tuple[dict[str, float | None], list[str], dict[str, int],
                                                 dict[str, str]]:  # fmt: skip
    """(each API's error, the failing APIs, each API's place in execution order, the suspects' stack lines)
    over the ranks' results. An API's error is the largest max relative error of its output rows (1 -
    cosine where the mode has no relative error; its input rows where it has no output), as the server's
    ``comparison_calls`` hold it."""
    errors: dict[str, float | None] = {}
    failing_now: dict[str, None] = {}
    order: dict[str, int] = {}
    stacks: dict[str, str] = {}
    for result in results:
        header = result.header
        rel = header.index("MaxRelativeErr") if "MaxRelativeErr" in header else None
        cos = header.index("Cosine") if "Cosine" in header else None
        rank_errors: dict[str, float | None] = {}
        with_output: set[str] = set()
        for row in result.rows:
            api = row.api
            order.setdefault(api, len(order))
            name = str(row.cells[0]) if row.cells else ""
            is_output = name.startswith(api) and ".output" in name[len(api):]
            if is_output and api not in with_output:  # its outputs' error, not its inputs'
                with_output.add(api)
                rank_errors[api] = None
            elif api in with_output and not is_output:
                continue
            value, old = _error(row.cells, rel, cos), rank_errors.get(api)
            rank_errors[api] = old if value is None else value if old is None else max(old, value)
        for api, value in rank_errors.items():
            old = errors.get(api)
            errors[api] = old if value is None else value if old is None else max(old, value)
        for api in result.failing_apis():
            failing_now.setdefault(api)
        for s in [*result.suspects, result.first_divergence]:
            if s is not None and s.stack:
                stacks.setdefault(s.api, s.stack)
    return errors, list(failing_now), order, stacks


def _error(cells: list[Any], rel: int | None, cos: int | None) -> float | None:
    """A row's error: its max relative error (msprobe's ``"12.5%"`` text as 0.125), else 1 - cosine."""
    for col, to_error in ((rel, abs), (cos, lambda c: max(0.0, 1.0 - c))):
        if col is None or col >= len(cells):
            continue
        cell = cells[col]
        if isinstance(cell, bool):
            continue
        if isinstance(cell, str):
            text = cell.strip()
            try:
                cell = float(text[:-1]) / 100 if text.endswith("%") else float(text)
            except ValueError:
                continue
        if isinstance(cell, (int, float)) and math.isfinite(cell):
            return float(to_error(cell))
    return None


def read_previous(path: Path) -> tuple[dict[str, float | None], list[str]]:
    """(each API's error, the failing APIs) of an earlier check's ``check_summary.json``."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ClientError(f"--previous {path}: cannot read it: {exc}") from None
    apis = doc.get("apis") if isinstance(doc, dict) and doc.get("kind") == "parity-check" else None
    if not isinstance(apis, dict):
        raise ClientError(f"--previous {path}: not a {CHECK_SUMMARY} of parity check (no 'apis')")
    errors: dict[str, float | None] = {}
    failing_before: list[str] = []
    for api, entry in apis.items():
        if not isinstance(entry, dict):
            raise ClientError(f"--previous {path}: apis.{api}: expected an object")
        error = entry.get("error")
        errors[str(api)] = float(error) if isinstance(error, (int, float)) else None
        if entry.get("failing") is True:
            failing_before.append(str(api))
    return errors, failing_before
