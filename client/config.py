"""config.json (dump-format.md §2) parsed and validated once, at ``PrecisionDebugger`` construction.

An msprobe user's config.json works unchanged where Parity does what it asks: every field msprobe 8.3.3 and
26.x ship or document is known. The fields Parity acts on are checked against their allowed values (26.x's
``summary_mode: "xor"``, ``statistics.tensor_list``, ``precision: "low"``, ``risk_level: "ALL"``,
``dump_enable: true`` included); ``tensor.bench_path`` with ``diff_nums`` (msprobe 26's one-pass divergence
dump, also spelled ``task: "diff_check"``) runs :mod:`parity.client.diff_check`; a 26.x setting Parity does
not carry out (the ``load`` section, ``level: "debug"``, ``precision: "high"``, ``risk_level`` ``CORE`` or
``FOCUS``, ``dump_enable: false``, ``slice``) is refused by name with the reason (:data:`REFUSED_26`), never
accepted and ignored; the fields neither tool acts on for a PyTorch dump of this task (the
``overflow_check``/``run_ut``/... sections of other tasks, ``enable_dataloader``, ``seed``,
``file_format``...) are named in one warning. A field
neither tool knows is an error with the closest known name, so a typo (``"levle"``) fails before training
starts instead of producing an empty dump hours later. Constructor arguments win over the file;
``PARITY_SERVER`` / ``PARITY_TOKEN`` fill in ``server`` / ``token``. The run's name, project and tags follow
the server's rule (:mod:`parity.shared.naming`), the server URL and the token are checked for form here
(reaching the server is the uploader's check, at construction too).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from parity.client.errors import ConfigError
from parity.client.index_ranges import IndexRanges
from parity.client.server_address import base_url, clean_token
from parity.shared.naming import NameRefused, check_name, check_tags

__all__ = ["DebuggerConfig", "apply_plan", "load_config", "parse_index_list"]

log = logging.getLogger(__name__)

TASKS = ("statistics", "tensor")
#: msprobe 26's one-pass divergence dump: task ``tensor`` with ``tensor.bench_path`` (how msprobe 26.2.0
#: runs it), or ``task: "diff_check"`` with a ``bench_path`` in its section or ``tensor``'s; written as tensor
DIFF_CHECK = "diff_check"
LEVELS = ("L0", "L1", "mix")
SUMMARY_MODES = ("statistics", "md5", "xor")
#: msprobe 26's tasks and levels that Parity does not run, each with the reason (refused by name)
REFUSED_26 = {
    "task:structure": "msprobe 26's structure-only dump is not implemented; use task statistics",
    "task:acc_check": "msprobe's online accuracy check is not a dump Parity writes",
    "task:nan_check": "msprobe 26's NaN check is not implemented; `parity compare` flags NaN/Inf rows",
    "level:debug": "PrecisionDebugger.save and debug.json (level debug) are not implemented in Parity",
    "level:L2": "the kernel-level (L2) dump needs msprobe's NPU kernel hooks",
    "load": "msprobe 26's module input override (load) is not implemented in Parity",
    "slice": "msprobe 26's tensor slicing before statistics is not implemented in Parity; leave it empty",
    "precision:high": "msprobe 26.2.0's high precision writes no Mean and Norm; Parity computes them as "
    "\"low\" does (its default)",
    "risk_level": "Parity records every API (risk_level \"ALL\"); msprobe 26's CORE/FOCUS API tables are "
    "not carried; choose the calls with list or scope instead",
    "dump_enable:false": "the config hot reload (dump_enable) is not implemented in Parity: a dump that "
    "starts disabled would never record; start and stop the dump with PrecisionDebugger.start()/stop()",
}
DATA_MODES = ("all", "forward", "backward", "input", "output")
COMMON_FIELDS = (
    "task", "dump_path", "rank", "step", "level", "async_dump", "extra_info", "host_buffer_mb",
    "server", "token", "run_name", "project", "tags", "plan", "planned_by", *TASKS, DIFF_CHECK,
)  # fmt: skip
#: Parity's own task field (``parity plan`` writes it; msprobe ignores it): with ``list``, every call keeps
#: its statistics entry and only the listed calls get tensor files.
STATISTICS_FOR_ALL = "parity_statistics_for_all"
TASK_FIELDS = ("scope", "list", "data_mode", "summary_mode", STATISTICS_FOR_ALL)
#: msprobe's fields (8.3.3's shipped config.json and docs, 26.x's docs) that Parity accepts and does not act
#: on; a task section of msprobe's other tasks is accepted whole.
MSPROBE_FIELDS = ("enable_dataloader", "seed", "is_deterministic", "custom_op_namespaces")
#: msprobe 26's common fields Parity acts on (or refuses a value of, by name: REFUSED_26)
MSPROBE_26_ACTED = ("precision", "risk_level", "dump_enable", "load")
MSPROBE_SECTIONS = ("overflow_check", "run_ut", "acc_check", "grad_probe", "free_benchmark", "nan_check",
                    "exception_dump")  # fmt: skip
MSPROBE_TASK_FIELDS = ("file_format", "backward_input", "request_id", "overflow_nums", "check_mode")
#: msprobe 26's task fields Parity acts on, or refuses a value of by name (REFUSED_26)
MSPROBE_26_TASK_FIELDS = ("tensor_list", "slice", "bench_path", "diff_nums")


@dataclass(frozen=True)
class DebuggerConfig:
    """The validated configuration; ``steps``/``ranks`` of None mean "all"."""

    task: str = "statistics"
    dump_path: Path = Path("./dump_path")
    level: str = "L1"
    ranks: IndexRanges | None = None
    steps: IndexRanges | None = None
    async_dump: bool = False
    extra_info: bool = True
    #: task ``tensor``: host memory (MiB) that copies of device tensors may hold while waiting to be written;
    #: past it training waits for the writer (a step is never slower than writing its bytes)
    host_buffer_mb: int = 1024
    scope: tuple[str, ...] = ()
    api_list: tuple[str, ...] = ()
    data_mode: frozenset[str] = frozenset({"all"})
    summary_mode: str = "statistics"
    server: str | None = None
    run_name: str | None = None
    project: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    token: str | None = None
    #: ``list`` names the calls that get tensor files; every call keeps its statistics entry (a planned dump)
    statistics_for_all: bool = False
    #: the comparison whose plan the debugger fetches from ``server`` at construction
    plan: str | None = None
    #: the comparison that planned this dump (the run's provenance on the server)
    planned_by: str | None = None
    #: msprobe 26's one-pass divergence dump: the baseline (an md5 or xor dump: its root, a step folder or a
    #: dump.json) whose checksums each call is judged against; None: no diff_check
    bench_path: Path | None = None
    #: how many culprits diff_check looks for (-1: no limit)
    diff_nums: int = 1

    def wants(self, direction: str, io: str) -> bool:
        """Whether ``data_mode`` keeps this direction (forward/backward) and side (input/output)."""
        modes = self.data_mode
        if "all" in modes:
            return True
        dirs = modes & {"forward", "backward"} or {"forward", "backward"}
        ios = modes & {"input", "output"} or {"input", "output"}
        return direction in dirs and io in ios

    @property
    def max_step(self) -> int | None:
        return self.steps.max() if self.steps else None


def parse_index_list(value: Any, field_name: str, source: str | None = None) -> IndexRanges | None:
    """Parse ``rank``/``step``: a list of ints, ``"N"`` or inclusive ``"a-b"`` ranges; ``[]`` = all. The
    ranges stay ranges (``"0-4000000000"`` is two ints, not four billion)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list):
        raise ConfigError(
            field_name, f'must be a list of ints, "N" or "a-b" strings, got {value!r}', source=source
        )
    out: list[tuple[int, int]] = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
            out.append((item, item))
            continue
        if isinstance(item, str):
            text = item.strip()
            lo, sep, hi = text.partition("-")
            try:
                if not sep:
                    if int(text) < 0:
                        raise ValueError
                    out.append((int(text), int(text)))
                    continue
                a, b = int(lo), int(hi)
            except ValueError:
                a, b = -1, -1
            if 0 <= a <= b:
                out.append((a, b))
                continue
        raise ConfigError(
            field_name,
            f'bad item {item!r}: allowed are ints >= 0, "N" and ranges "a-b" with a <= b',
            source=source,
        )
    return IndexRanges(out) if out else None


def _choice(
    raw: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str, where: str, src: str | None
) -> str:
    value = raw.get(key, default)
    if value not in allowed:
        raise ConfigError(where, f"{value!r} is not allowed; allowed: {', '.join(allowed)}", source=src)
    return str(value)


def _bool(raw: Mapping[str, Any], key: str, default: bool, src: str | None) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {value!r}", source=src)
    return value


#: a ``list`` is matched against every call's name while training: bounded in items and in characters
MAX_PATTERNS = 10_000
MAX_PATTERN_CHARS = 1_000


def _str_list(value: Any, where: str, src: str | None, *, patterns: bool = False) -> tuple[str, ...]:
    """A list of strings; ``patterns``: names or parts of names (``list``), each non-empty (an empty one
    would match every call, a full tensor dump from a targeted config) and within the bounds above."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        shown = repr(value) if len(repr(value)) <= 200 else f"a {type(value).__name__}"
        raise ConfigError(where, f"must be a list of strings, got {shown}", source=src)
    if patterns:
        if len(value) > MAX_PATTERNS:
            raise ConfigError(where, f"has {len(value):,} items; at most {MAX_PATTERNS:,}", source=src)
        for i, item in enumerate(value):
            if not item.strip():
                raise ConfigError(f"{where}[{i}]", "is empty: it would match every call; name the calls (or "
                                  "leave list out for all of them)", source=src)  # fmt: skip
            if len(item) > MAX_PATTERN_CHARS:
                raise ConfigError(f"{where}[{i}]", f"has {len(item):,} characters; at most "
                                  f"{MAX_PATTERN_CHARS:,}", source=src)  # fmt: skip
    return tuple(value)


def _opt_str(raw: Mapping[str, Any], key: str, src: str | None) -> str | None:
    value = raw.get(key)
    if value is not None and not isinstance(value, str):
        raise ConfigError(key, f"must be a string, got {value!r}", source=src)
    return value


def _unknown(field: str, key: str, known: Iterable[str], src: str | None) -> ConfigError:
    """An unknown field, with the closest name Parity or msprobe knows."""
    known = list(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(field, f"unknown field; {hint}known: {', '.join(known)}", source=src)


def _task_section(raw: Any, task: str, src: str | None, ignored: list[str]) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(task, f"must be an object with fields {', '.join(TASK_FIELDS)}", source=src)
    for key in raw:
        if key in MSPROBE_TASK_FIELDS:
            ignored.append(f"{task}.{key}")
        elif key not in TASK_FIELDS and key not in MSPROBE_26_TASK_FIELDS:
            known = (*TASK_FIELDS, *MSPROBE_26_TASK_FIELDS, *MSPROBE_TASK_FIELDS)
            raise _unknown(f"{task}.{key}", key, known, src)
    if raw.get("slice"):
        raise ConfigError(f"{task}.slice", f"{raw['slice']!r} not supported: {REFUSED_26['slice']}",
                          source=src)  # fmt: skip
    return raw


def _diff_check(raw: Mapping[str, Any], task: str, section: Mapping[str, Any], summary_mode: str,
                src: str | None, ignored: list[str]) -> tuple[Path | None, int]:  # fmt: skip
    """``(bench_path, diff_nums)`` of a divergence dump, ``(None, 1)`` for any other: msprobe 26.2.0 runs it
    for task ``tensor`` with a ``tensor.bench_path``; ``task: "diff_check"`` takes its section's or
    ``tensor``'s."""
    where = task
    bench = section.get("bench_path")
    if task == DIFF_CHECK and not bench and isinstance(raw.get("tensor"), dict):
        where, bench = "tensor", raw["tensor"].get("bench_path")
    for other in (*TASKS, DIFF_CHECK):  # a section of a task not run: msprobe does not read it either
        other_section = raw.get(other)
        if other not in (task, where) and isinstance(other_section, dict):
            ignored += [f"{other}.{k}" for k in ("bench_path", "diff_nums") if other_section.get(k)]
    if not bench:
        if task == DIFF_CHECK:
            raise ConfigError("diff_check.bench_path", "is missing: Parity judges each call against a "
                              "baseline dump's checksums (msprobe 26.2.0 reads an Ascend NPU flag instead, "
                              "never set off the NPU); set tensor.bench_path to an md5 or xor dump",
                              source=src)  # fmt: skip
        if "diff_nums" in section:
            ignored.append(f"{task}.diff_nums")  # msprobe reads it only with a bench_path
        return None, 1
    if not isinstance(bench, str):
        raise ConfigError(f"{where}.bench_path", f"must be a path string, got {bench!r}", source=src)
    nums = section.get("diff_nums", 1)
    if nums is None:
        nums = 1
    if isinstance(nums, bool) or not isinstance(nums, int) or (nums != -1 and nums <= 0):
        raise ConfigError(f"{task}.diff_nums", f"must be -1 (no limit) or a positive integer, got {nums!r}",
                          source=src)  # fmt: skip
    if summary_mode not in ("md5", "xor"):
        raise ConfigError(f"{task}.summary_mode", f"{summary_mode!r} with {where}.bench_path: the divergence "
                          'dump compares checksums; set "md5" or "xor", as the baseline was dumped',
                          source=src)  # fmt: skip
    if not Path(bench).exists():
        raise ConfigError(f"{where}.bench_path", f"{bench!r} does not exist", source=src)
    return Path(bench), nums


def _refuse_26(raw: Mapping[str, Any], src: str | None) -> None:
    """msprobe 26's tasks, levels and common settings that Parity does not carry out: refused by name."""
    for key in ("task", "level"):
        reason = REFUSED_26.get(f"{key}:{raw.get(key)}")
        if reason is not None:
            raise ConfigError(key, f"{raw[key]!r} not supported: {reason}", source=src)
    if "load" in raw:
        raise ConfigError("load", f"not supported: {REFUSED_26['load']}", source=src)
    precision = raw.get("precision", "low")
    if precision == "high":
        raise ConfigError("precision", f"'high' not supported: {REFUSED_26['precision:high']}", source=src)
    if precision != "low":
        raise ConfigError("precision", f"{precision!r} is not allowed; allowed: low, high", source=src)
    risk = raw.get("risk_level", "ALL")
    if risk in ("CORE", "FOCUS"):
        raise ConfigError("risk_level", f"{risk!r} not supported: {REFUSED_26['risk_level']}", source=src)
    if risk != "ALL":
        raise ConfigError("risk_level", f"{risk!r} is not allowed; allowed: CORE, FOCUS, ALL", source=src)
    enable = raw.get("dump_enable")
    if enable is False:
        raise ConfigError("dump_enable", f"false not supported: {REFUSED_26['dump_enable:false']}",
                          source=src)  # fmt: skip
    if enable is not None and enable is not True:
        raise ConfigError("dump_enable", f"must be true or false, got {enable!r}", source=src)
    if enable is True:
        log.warning("parity: %s: dump_enable: the dump is on; Parity does not reload config.json while the "
                    "job runs (msprobe 26 checks it every 0.5 s): stop and start the dump with "
                    "PrecisionDebugger.stop()/start()", src or "config")  # fmt: skip


def load_config(config_path: str | os.PathLike[str] | None = None, **overrides: Any) -> DebuggerConfig:
    """Read ``config_path`` (optional), apply non-None ``overrides`` (constructor arguments), validate."""
    src = str(config_path) if config_path is not None else None
    raw: dict[str, Any] = {}
    if config_path is not None:
        try:
            raw = json.loads(Path(config_path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError("config_path", f"cannot read the config file: {exc}", source=src) from exc
        except json.JSONDecodeError as exc:
            raise ConfigError("config_path", f"not valid JSON: {exc}", source=src) from exc
        if not isinstance(raw, dict):
            raise ConfigError("config_path", "the top level must be a JSON object", source=src)
    ignored: list[str] = []  # msprobe's fields present in the file, accepted, not acted upon
    for key in raw:
        if key in MSPROBE_FIELDS or key in MSPROBE_SECTIONS:
            ignored.append(key)
        elif key not in COMMON_FIELDS and key not in MSPROBE_26_ACTED:
            known = (*COMMON_FIELDS, *MSPROBE_26_ACTED, *MSPROBE_FIELDS, *MSPROBE_SECTIONS)
            raise _unknown(key, key, known, src)
    _refuse_26(raw, src)
    for key, value in overrides.items():
        if key not in COMMON_FIELDS:
            raise ConfigError(key, f"unknown argument; allowed: {', '.join(COMMON_FIELDS)}")
        if value is not None:
            raw[key] = value
    task = _choice(raw, "task", (*TASKS, DIFF_CHECK), "statistics", "task", src)
    level = _choice(raw, "level", LEVELS, "L1", "level", src)
    for other in (*TASKS, DIFF_CHECK):
        if other != task and other in raw:
            _task_section(raw[other], other, src, ignored)  # still validated: a typo there is a typo
    section = _task_section(raw.get(task), task, src, ignored)
    scope = _str_list(section.get("scope"), f"{task}.scope", src)
    if len(scope) not in (0, 2):
        raise ConfigError(f"{task}.scope", f"must list exactly 2 entry names (first, last), got {len(scope)}",
                          source=src)  # fmt: skip
    data_mode = _str_list(section.get("data_mode", ["all"]), f"{task}.data_mode", src)
    bad = [m for m in data_mode if m not in DATA_MODES]
    if bad or not data_mode:
        raise ConfigError(f"{task}.data_mode", f"{bad or data_mode!r} not allowed; allowed: "
                          f"{', '.join(DATA_MODES)} (\"all\" alone)", source=src)  # fmt: skip
    if "all" in data_mode and len(data_mode) > 1:
        raise ConfigError(f"{task}.data_mode", '"all" cannot be combined with other modes', source=src)
    summary_mode = _choice(section, "summary_mode", SUMMARY_MODES, "statistics", f"{task}.summary_mode", src)
    bench_path, diff_nums = _diff_check(raw, task, section, summary_mode, src, ignored)
    if task == DIFF_CHECK:
        task = "tensor"  # what msprobe 26 writes for it
    async_dump = _bool(raw, "async_dump", False, src)
    if async_dump and summary_mode in ("md5", "xor"):
        raise ConfigError("async_dump", f'cannot be combined with summary_mode "{summary_mode}"', source=src)
    host_buffer_mb = raw.get("host_buffer_mb", 1024)
    if isinstance(host_buffer_mb, bool) or not isinstance(host_buffer_mb, int) or host_buffer_mb < 1:
        raise ConfigError("host_buffer_mb", f"must be a positive integer (MiB), got {host_buffer_mb!r}",
                          source=src)  # fmt: skip
    dump_path = raw.get("dump_path", "./dump_path")
    if not isinstance(dump_path, (str, os.PathLike)) or not str(dump_path):
        raise ConfigError("dump_path", f"must be a non-empty path string, got {dump_path!r}", source=src)
    tags = raw.get("tags") or {}
    if isinstance(tags, list) and all(isinstance(t, str) for t in tags):
        tags = dict.fromkeys(tags, "")
    if not isinstance(tags, dict):
        raise ConfigError(
            "tags", f"must be an object of strings or a list of strings, got {tags!r}", source=src
        )
    server, token = _server_and_token(raw, src)
    try:  # the server's own rule (parity.shared.naming), checked here so that a slip fails before training
        tags = check_tags({str(k): str(v) for k, v in tags.items()})
        run_name = _opt_str(raw, "run_name", src)
        run_name = check_name(run_name, "run_name") if run_name is not None else None
        project = _opt_str(raw, "project", src)
        project = check_name(project, "project") if project is not None else None
    except NameRefused as exc:
        raise ConfigError(exc.field, exc.problem, source=src) from None
    if ignored:
        log.warning("parity: %s: msprobe fields that Parity accepts and does not act on: %s",
                    src or "config", ", ".join(ignored))  # fmt: skip
    statistics_for_all = section.get(STATISTICS_FOR_ALL, False)
    if not isinstance(statistics_for_all, bool):
        raise ConfigError(f"{task}.{STATISTICS_FOR_ALL}",
                          f"must be true or false, got {statistics_for_all!r}", source=src)  # fmt: skip
    api_list = _str_list(section.get("list"), f"{task}.list", src, patterns=True)
    tensor_list = _str_list(section.get("tensor_list"), f"{task}.tensor_list", src, patterns=True)
    if tensor_list and task != "statistics":
        ignored.append(f"{task}.tensor_list")  # msprobe 26 reads it in a statistics task only
    elif tensor_list:
        # msprobe 26: a statistics dump that also writes the tensors of the calls whose names contain an item
        # of tensor_list; Parity's planned dump is that (statistics for every call, files for the listed)
        if api_list:
            raise ConfigError("statistics.tensor_list", "cannot be combined with statistics.list in Parity "
                              "(its tensor files follow a list that selects no calls): use one",
                              source=src)  # fmt: skip
        task, api_list, statistics_for_all = "tensor", tensor_list, True
    return DebuggerConfig(
        task=task,
        dump_path=Path(dump_path),
        level=level,
        ranks=parse_index_list(raw.get("rank"), "rank", src),
        steps=parse_index_list(raw.get("step"), "step", src),
        async_dump=async_dump,
        extra_info=_bool(raw, "extra_info", True, src),
        host_buffer_mb=host_buffer_mb,
        scope=scope,
        api_list=api_list,
        data_mode=frozenset(data_mode),
        summary_mode=summary_mode,
        server=server,
        run_name=run_name,
        project=project,
        tags=tags,
        token=token,
        statistics_for_all=statistics_for_all,
        plan=_opt_str(raw, "plan", src) or None,
        planned_by=_opt_str(raw, "planned_by", src) or None,
        bench_path=bench_path,
        diff_nums=diff_nums,
    )


def apply_plan(cfg: DebuggerConfig, plan: Mapping[str, Any], comparison: str) -> DebuggerConfig:
    """``cfg`` with a fetched plan's config.json applied: task ``tensor``, its level, steps, ranks and
    ``list``, statistics for every call, and ``planned_by`` set; where to dump, the server and the run's
    name stay the user's."""
    src = f"plan of comparison {comparison}"
    section = plan.get("tensor")
    if plan.get("task") != "tensor" or not isinstance(section, dict):
        raise ConfigError("plan", "the server's plan is not a tensor-task config", source=src)
    level = _choice(plan, "level", LEVELS, cfg.level, "level", src)
    return replace(
        cfg, task="tensor", level=level, steps=parse_index_list(plan.get("step"), "step", src),
        ranks=parse_index_list(plan.get("rank"), "rank", src), scope=(),
        api_list=_str_list(section.get("list"), "tensor.list", src, patterns=True), statistics_for_all=True,
        plan=comparison, planned_by=comparison,
    )  # fmt: skip


def _server_and_token(raw: Mapping[str, Any], src: str | None) -> tuple[str | None, str | None]:
    """``server`` (or ``PARITY_SERVER``) as a base URL, ``token`` (or ``PARITY_TOKEN``) trimmed; a URL or a
    token that could never work is an error now rather than a failed upload after training."""
    server, where = _opt_str(raw, "server", src), src
    if not server and os.environ.get("PARITY_SERVER"):
        server, where = os.environ["PARITY_SERVER"], "PARITY_SERVER"
    token, token_where = _opt_str(raw, "token", src), src
    if not token and os.environ.get("PARITY_TOKEN"):
        token, token_where = os.environ["PARITY_TOKEN"], "PARITY_TOKEN"
    try:
        server = base_url(server) if server else None
    except ValueError as exc:
        raise ConfigError("server", str(exc), source=where) from None
    try:
        token = clean_token(token) if token else None
    except ValueError as exc:
        raise ConfigError("token", str(exc), source=token_where) from None
    return server, token
