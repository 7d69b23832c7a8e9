"""The ``parity`` command: one entry point, one module per sub-command under ``parity.commands``.

Sub-command modules are imported only when chosen, so ``parity compare`` never imports the server stack and
``parity server`` never imports torch. Every expected failure is a ``ParityError`` (or a client/server error
of the same family) and becomes one line on stderr with exit code 2; only a bug shows a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

# name -> (module under parity.commands, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "compare": ("compare", "compare two dumps described by a compare.json (no server needed)"),
    "replay": ("replay", "run recorded calls again on the CPU in float64: which side's kernel is wrong"),
    "server": ("server", "run the Parity server (FastAPI under uvicorn)"),
    "db": ("db", "database maintenance: 'parity db upgrade' runs the migrations"),
    "upload": ("upload", "upload an existing dump directory to a server"),
    "compare-runs": ("compare_runs", "compare two uploaded runs on a server and download the reports"),
    "regressions": ("regressions", "a comparison's new and worse APIs against the baseline"),
    "check": ("check", "the CI gate: exit 1 when a run has APIs new or worse against the baseline"),
    "overflow-check": ("overflow_check", "the first call to make NaN/Inf across a step's ranks"),
    "merge-result": ("merge_result", "chosen APIs x ranks x metrics of compare results in one workbook"),
    "plan": ("plan", "write the next dump's config.json: tensor files for a comparison's suspects only"),
    "runs": ("runs", "list, delete or make a baseline of runs on a server"),
    "accept": ("accept", "accept a failing API with a note (or --revoke it) in a project"),
    "gc": ("gc", "server maintenance: remove orphaned blobs, stale temp files and expired runs"),
}

#: msprobe's spelling of a command, accepted beside Parity's (``parity merge_result``, as msprobe's)
ALIASES: dict[str, str] = {"overflow_check": "overflow-check", "merge_result": "merge-result"}

EXIT_USAGE = 2


def _build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog="parity", description="Precision comparison for PyTorch training.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    parser.add_argument("--version", action="version", version=_version_text())
    # msprobe's habit: ``msprobe -f pytorch compare ...``. Parity reads PyTorch dumps only, so the flag is
    # accepted for pytorch and refused, with the reason, for mindspore.
    parser.add_argument(
        "-f",
        "--framework",
        choices=("pytorch", "mindspore"),
        default=None,
        help="msprobe's framework switch: Parity reads PyTorch dumps (pytorch is the only value it accepts)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    chosen = next((ALIASES.get(a, a) for a in argv if a in COMMANDS or a in ALIASES), None)
    for name, (module_name, help_text) in COMMANDS.items():
        aliases = [alias for alias, command in ALIASES.items() if command == name]
        cmd_parser = sub.add_parser(name, help=help_text, description=help_text, aliases=aliases)
        if name == chosen:
            module = importlib.import_module(f"parity.commands.{module_name}")
            module.add_arguments(cmd_parser)
            cmd_parser.set_defaults(_run=module.run)
    return parser, parser.parse_args(argv)


def _version_text() -> str:
    from parity import MSPROBE_COMPAT, __version__

    return f"parity {__version__} (dumps and compare reports in msprobe {MSPROBE_COMPAT}'s layout)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    from parity.errors import missing_extra

    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(args_list)
    except ModuleNotFoundError as exc:  # a light install (the client only) running a command of an extra
        advice = missing_extra(exc)
        if advice is None:
            raise
        command = next((a for a in args_list if a in COMMANDS), None)
        sys.stderr.write(f"parity {command}: error: {advice}\n" if command else f"parity: error: {advice}\n")
        return EXIT_USAGE


def _main(args_list: list[str]) -> int:
    parser, args = _build_parser(args_list)
    quiet = getattr(args, "quiet", False)  # a command's own -q/--quiet
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        # httpx logs each request at INFO: one line per uploaded file would drown the progress.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    from parity.errors import user_error_types

    if args.framework == "mindspore":
        sys.stderr.write("parity: error: -f mindspore: Parity reads PyTorch dumps only (use -f pytorch)\n")
        return EXIT_USAGE
    try:
        return int(args._run(args) or 0)
    except user_error_types() as exc:
        sys.stderr.write(f"parity {args.command}: error: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write(f"parity {args.command}: interrupted\n")
        return 130


def console_main() -> int:
    """The ``parity`` command as installed: :func:`main`, and a finished ``compare`` ends without the
    interpreter's teardown (``process_policy.exit_without_teardown``: 0.3 s of a large tensor compare)."""
    args_list = sys.argv[1:]
    code = main(args_list)
    if next((a for a in args_list if a in COMMANDS), None) == "compare":
        from parity.process_policy import exit_without_teardown

        exit_without_teardown(code)
    return code


if __name__ == "__main__":
    raise SystemExit(console_main())
