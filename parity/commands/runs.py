"""``parity runs list|show|delete|baseline``: find, read, remove and promote runs on a server, in the REST
API's words.

``list`` takes the filters ``GET /runs`` does (``--tag KEY=VALUE`` as on ``parity upload``, ``--name`` exact,
``--name-contains`` a substring in any case) and prints a table, one run per line, whose second column is
the run's verdict against its project's baseline (``WORSE``/``NEW`` in capitals, ``clean``, ``not compared``,
``baseline`` for the baseline itself). ``show`` prints one run and every comparison it takes part in, the one
against the baseline first, each with its verdict. ``delete`` takes a run id or name
and refuses a run that comparisons use unless ``--with-comparisons`` is given, as the server does.
``baseline`` makes a run (id or name, ``--project`` to look the name up in) its project's baseline
(``PATCH /runs/{run}`` with ``{"baseline": true}``).
"""

from __future__ import annotations

import argparse
import sys

from parity.client.errors import ClientError
from parity.client.rest import ApiError, ParityClient
from parity.commands import server_args, upload
from parity.shared.contract import BaselineVerdict, ComparisonPublic, RunPublic
from parity.shared.numbers import listed

#: Comparisons named in the refusal of a delete.
LISTED = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    listing = actions.add_parser("list", help="list runs, newest first", description="List runs.")
    server_args.add_server_arguments(listing)
    listing.add_argument("--project", default=None, help="only runs of this project")
    listing.add_argument("--name", default=None, help="only runs of exactly this name")
    listing.add_argument("--name-contains", default=None, metavar="TEXT", help="only names holding TEXT")
    listing.add_argument("--status", default=None, choices=("uploading", "validating", "complete", "invalid"))
    listing.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE",
                         help="only runs with this tag (repeatable: all of them)")
    listing.add_argument("--limit", type=int, default=50, help="at most this many runs (default: 50)")
    show = actions.add_parser("show", help="one run and its comparisons, each with its verdict",
                              description="One run and every comparison it takes part in, with verdicts.")
    show.add_argument("run", metavar="RUN", help="run id or name")
    show.add_argument("--project", default=None, help="project to look the name up in")
    server_args.add_server_arguments(show)
    delete = actions.add_parser("delete", help="delete a run and its files",
                                description="Delete a run and its files.")  # fmt: skip
    delete.add_argument("run", metavar="RUN", help="run id or name")
    server_args.add_server_arguments(delete)
    delete.add_argument("--with-comparisons", action="store_true",
                        help="also delete the comparisons that use the run, and their reports")
    baseline = actions.add_parser(
        "baseline", help="make a run its project's baseline (auto-compare and regressions use it)",
        description="Make a run its project's baseline: later runs of the project are compared with it.",
    )  # fmt: skip
    baseline.add_argument("run", metavar="RUN", help="run id or name")
    baseline.add_argument("--project", default=None, help="project to look the name up in")
    server_args.add_server_arguments(baseline)


#: The columns of ``parity runs list``.
HEADER = ("RUN", "AGAINST BASELINE", "STATUS", "DEVICE", "STEPS", "RANKS", "FILES", "TAGS", "ID")


def verdict_text(run: RunPublic) -> str:
    """The run's verdict against its project's baseline in a few words (``-`` from a server that does not
    judge it)."""
    return run.verdict.text() if run.verdict is not None else "baseline" if run.baseline else "-"


def run_cells(run: RunPublic) -> tuple[str, ...]:
    """One run's cells under :data:`HEADER`; tags as KEY=VALUE."""
    tags = " ".join(f"{k}={v}" for k, v in sorted(run.tags.items()))
    return (f"{run.project}/{run.name}", verdict_text(run), run.status, run.device,
            listed(run.steps).replace(" ", ""), listed(run.ranks).replace(" ", ""),
            f"{run.file_count} files {run.total_bytes / 1e6:.1f} MB", tags or "-", run.id)  # fmt: skip


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Left-aligned columns two spaces apart (the last one not padded)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)) + "  " + r[-1]
            for r in [header, *rows]]  # fmt: skip


def format_run(run: RunPublic) -> str:
    """One line: the cells of :func:`run_cells`, unaligned."""
    return "  ".join(run_cells(run))


def comparison_cells(c: ComparisonPublic, run: RunPublic, names: dict[str, str],
                     verdict: str) -> tuple[str, ...]:  # fmt: skip
    other = c.bench_run if c.target_run == run.id else c.target_run
    role = "target" if c.target_run == run.id else "bench"
    against = "vs baseline" if c.against_baseline else "-"
    return (c.id, role, names.get(other, other), against, str(c.step), c.status, verdict,
            c.created_at.strftime("%Y-%m-%d %H:%M"))  # fmt: skip


COMPARISON_HEADER = ("COMPARISON", "ROLE", "OTHER RUN", "BASELINE", "STEP", "STATUS", "VERDICT", "CREATED")


def comparison_verdict(api: ParityClient, c: ComparisonPublic) -> str:
    """A comparison's verdict: against the baseline its new/worse/known/fixed counts, otherwise how many
    APIs fail (nothing to judge new or worse by)."""
    if c.status != "succeeded" or c.summary is None:
        return c.error.splitlines()[0][:80] if c.status == "failed" and c.error else "-"
    if not c.against_baseline:
        return f"{len(c.summary.failing_apis)} failing APIs"
    r = api.regressions(c.id)
    return BaselineVerdict(verdict=r.overall(), new=r.new, worse=r.worse, known=r.known, fixed=r.fixed).text()


def show_lines(api: ParityClient, run: RunPublic) -> list[str]:
    """``parity runs show``: the run, then its comparisons, against the baseline first (newest first)."""
    found, _ = api.list_runs(name=run.name, project=run.project, verdicts=True)
    run = next((r for r in found if r.id == run.id), run)
    lines = [f"run {run.id}  {run.project}/{run.name}  {run.status}  {run.device}",
             f"  against baseline: {verdict_text(run)}"
             + (f" (baseline {run.verdict.baseline_name})" if run.verdict and run.verdict.baseline_name
                and not run.baseline else "")
             + (f": {run.verdict.note}" if run.verdict and run.verdict.note else ""),
             f"  steps {listed(run.steps)}  ranks {listed(run.ranks)}  {run.file_count} files "
             f"{run.total_bytes / 1e6:.1f} MB  dump {run.dump_task or '-'}",
             "  tags " + (" ".join(f"{k}={v}" for k, v in sorted(run.tags.items())) or "none")]  # fmt: skip
    if run.error:
        lines.append(f"  error: {run.error}")
    comparisons: list[ComparisonPublic] = []
    while True:
        page, total = api.list_comparisons(run=run.id, limit=200, offset=len(comparisons))
        comparisons += page
        if not page or len(comparisons) >= total:
            break
    comparisons.sort(key=lambda c: c.created_at, reverse=True)
    comparisons.sort(key=lambda c: not (c.against_baseline and c.target_run == run.id))  # stable
    if not comparisons:
        return [*lines, "no comparisons"]
    names = {run.id: run.name}
    for ref in {x for c in comparisons for x in (c.target_run, c.bench_run)} - set(names):
        try:
            names[ref] = api.get_run(ref).name
        except ApiError:
            names[ref] = ref
    rows = [comparison_cells(c, run, names, comparison_verdict(api, c)) for c in comparisons]
    return [*lines, "", *table(COMPARISON_HEADER, rows)]


def run(args: argparse.Namespace) -> int:
    with server_args.connect(args) as api:
        if args.action == "list":
            runs, total = api.list_runs(
                name=args.name, name_contains=args.name_contains, project=args.project, status=args.status,
                tags=upload.parse_tags(args.tag), limit=args.limit, verdicts=True,
            )  # fmt: skip
            if runs:
                sys.stdout.writelines(f"{line}\n" for line in table(HEADER, [run_cells(r) for r in runs]))
            else:
                sys.stderr.write("parity runs: no run matches these filters\n")
            if total > len(runs):
                sys.stderr.write(f"parity runs: {len(runs)} of {total} runs shown (raise --limit)\n")
            return 0
        if args.action == "show":
            sys.stdout.writelines(f"{line}\n" for line in show_lines(api, api.resolve_run(args.run,
                                                                                        project=args.project)))
            return 0
        if args.action == "baseline":
            run = api.set_baseline(args.run, project=args.project)
            sys.stderr.write(f"parity runs: run {run.id} ({run.name}) is the baseline of project "
                             f"{run.project!r}\n")  # fmt: skip
            return 0
        if not args.with_comparisons:
            # Said in the CLI's words; the server refuses the same delete on its own (409) in any case.
            used, total = api.list_comparisons(run=args.run, limit=LISTED)
            if total:
                ids = ", ".join(c.id for c in used) + (", ..." if total > len(used) else "")
                raise ClientError(
                    f"run {args.run} is used by {total} comparison(s) ({ids}): deleting it deletes them and "
                    "their reports too; nothing deleted: pass --with-comparisons to do so"
                )
        api.delete_run(args.run, with_comparisons=args.with_comparisons)
        sys.stderr.write(f"parity runs: run {args.run} deleted\n")
        return 0
