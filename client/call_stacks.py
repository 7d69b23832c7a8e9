"""stack.json of one step: the call stack of every recorded forward, deduplicated into groups (§4.6).

A stack is walked once per recorded call, so the walk is the hot part. Each stack gets a number for its
(code, instruction offset) pairs, cheap to read; only a number not seen before computes line numbers (what
groups are deduplicated by) and, for a new group, the text.

The number of a frame stands for (its caller's number, code, offset). Frames of the last stack are kept
with their numbers and their callers' numbers: a kept frame that is still running has the same callers,
whatever instruction it has moved on to, so the walk up stops at the first kept frame (a loop calling many
ops, a forward calling many modules walk a frame or three, not twenty). Two kinds of frames are walked
through but never kept: a generator's or coroutine's (it can be resumed from elsewhere, so its callers may
change) and nn.Module's call machinery (``_wrapped_call_impl``, ``_call_impl`` and its ``inner``): they
are new for every module call, so keeping them would only cost their bookkeeping and keep their locals
alive. Frames of the tool itself are dropped from the text and do not change the number (the user wants
their own code, not ours).
"""

from __future__ import annotations

import inspect
import itertools
import linecache
import os
from types import CodeType, FrameType

from parity.shared.dump import writer as dump_writer
from torch import nn

__all__ = ["CallStacks", "Stacks"]

#: stack.json's groups: (names of the calls, the frames as text, innermost first)
Stacks = list[tuple[list[str], list[str]]]

_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
#: a code object, whether it is the tool's own, whether its frames may be kept, its id
_Code = tuple[CodeType, bool, bool, int]
# id(code) -> _Code, cached per function. Keyed by id: a code object's own hash is recomputed from its fields
# at every lookup (about 0.5 us for a large function, 20 frames a stack); the code is held here, so its id is
# never reused.
_CODES: dict[int, _Code] = {}
_TOOL_DIRS = tuple(
    os.path.dirname(os.path.abspath(p)) + os.sep
    for p in (__file__, dump_writer.__file__ or "")
)


def _module_call_codes() -> tuple[CodeType, ...]:
    """The code of nn.Module's call machinery: ``_wrapped_call_impl``, ``_call_impl`` and the functions
    defined inside it (``inner``, which runs the hooks). Looked up, not assumed: whatever this torch
    version lacks is simply walked and kept like any other frame."""
    codes: list[CodeType] = []
    for name in ("_wrapped_call_impl", "_call_impl"):
        code = getattr(getattr(nn.Module, name, None), "__code__", None)
        if isinstance(code, CodeType):
            codes.append(code)
            codes.extend(c for c in code.co_consts if isinstance(c, CodeType))
    return tuple(codes)


_MODULE_CALL_CODES = _module_call_codes()  # held: their ids below stay unique
_NOT_KEPT = frozenset(id(c) for c in _MODULE_CALL_CODES)


def _named(name: str) -> CodeType | None:
    return next((c for c in _MODULE_CALL_CODES if c.co_name == name), None)


# nn.Module's call machinery as a module's hooks see it: ``_wrapped_call_impl`` calls ``_call_impl``, which
# calls ``inner``, which runs the hooks (None where this torch version has none: the walk takes those frames)
_WRAPPED_CODE, _IMPL_CODE, _HOOKS_CODE = _named("_wrapped_call_impl"), _named("_call_impl"), _named("inner")


def _code_info(code: CodeType) -> _Code:
    """What a stack walk needs to know of ``code``, looked up once: whether it is the tool's own, and whether
    its frames may be kept (not a generator's or coroutine's, not nn.Module's call machinery)."""
    cid = id(code)
    known = _CODES[cid] = (code, code.co_filename.startswith(_TOOL_DIRS),
                           not code.co_flags & _RESUMABLE and cid not in _NOT_KEPT, cid)  # fmt: skip
    return known

# A stack's number, its line numbers and its text are the same in every step: they are kept for the process
# (a step only groups its calls), so a stack seen in an earlier step is neither walked whole nor spelled
# again. Numbers come from one counter and are never reused, so starting the tables over (past
# _MAX_NUMBERS, when a step starts) cannot make two stacks of a step share a number.
_NUMBERS: dict[tuple[int, int, int], int] = {}  # (caller's number, id(code), offset) -> number
_LINES: dict[int, tuple[tuple[int, int], ...]] = {}  # a stack's number -> ((id(code), line), ...)
_TEXT: dict[tuple[tuple[int, int], ...], list[str]] = {}  # line numbers -> the frames as text
_counter = itertools.count()
_MODULE_CALLS: dict[tuple[int, int, int, int], int] = {}  # (caller's number, 3 offsets) -> number
_MAX_NUMBERS = 50_000


class CallStacks:
    """The stack groups of one step, and the kept frames of the last walk (see the module's docstring)."""

    def __init__(self) -> None:
        if len(_NUMBERS) > _MAX_NUMBERS:
            _NUMBERS.clear()
            _LINES.clear()
            _TEXT.clear()
            _MODULE_CALLS.clear()
        self.groups: Stacks = []
        self._by_lines: dict[tuple[tuple[int, int], ...], int] = {}  # ((id(code), line), ...) -> group
        self._by_number: dict[int, int] = {}  # a stack's number -> its group
        # the kept frames of the last stack, outermost first: (frame, offset, number, its caller's number);
        # id(frame) -> its index
        self._chain: list[tuple[FrameType, int, int, int]] = []
        self._chain_pos: dict[int, int] = {}

    def record(self, name: str, frame: FrameType | None) -> None:
        """Add ``name`` to the group of the stack that ``frame`` (its innermost frame) is the top of."""
        k = -1 if frame is None else self._number(frame)
        idx = self._by_number.get(k)
        if idx is None:
            idx = self._by_number[k] = self._group(k, frame)
        self.groups[idx][0].append(name)

    def _group(self, number: int, frame: FrameType | None) -> int:
        """The group of a stack new in this step: by its line numbers, a new group if none matches."""
        codes = _CODES
        by_line = _LINES.get(number)
        if by_line is None:
            lines: list[tuple[int, int]] = []
            f = frame
            while f is not None:
                code = f.f_code
                if not (codes.get(id(code)) or _code_info(code))[1]:
                    lines.append((id(code), f.f_lineno or 0))
                f = f.f_back
            by_line = _LINES[number] = tuple(lines)
        idx = self._by_lines.get(by_line)
        if idx is None:
            frames = _TEXT.get(by_line)
            if frames is None:
                frames = _TEXT[by_line] = [
                    f"File {c.co_filename}, line {ln}, in {c.co_name}, \n "
                    f"{linecache.getline(c.co_filename, ln).strip()}"
                    for c, ln in ((codes[cid][0], ln) for cid, ln in by_line)
                ]
            idx = self._by_lines[by_line] = len(self.groups)
            self.groups.append(([], frames))
        return idx

    def _number(self, frame: FrameType) -> int:
        """The number of the stack whose innermost frame is ``frame`` (walks up to the first kept frame)."""
        if frame.f_code is _HOOKS_CODE:
            # a module's hook: nn.Module's three call frames, then the caller's (usually kept). The three are
            # new at every call but always the same code at a few offsets: their number over the caller's is
            # looked up at once, the number the walk below gives them.
            impl = frame.f_back
            wrapped = None if impl is None else impl.f_back
            if (impl is not None and wrapped is not None and impl.f_code is _IMPL_CODE
                    and wrapped.f_code is _WRAPPED_CODE):  # fmt: skip
                outer = wrapped.f_back
                top = -1 if outer is None else self._number(outer)
                key = (top, wrapped.f_lasti, impl.f_lasti, frame.f_lasti)
                number = _MODULE_CALLS.get(key)
                if number is None:
                    number = top
                    for machinery in (wrapped, impl, frame):
                        number = _numbered(number, id(machinery.f_code), machinery.f_lasti)
                    _MODULE_CALLS[key] = number
                return number
        chain, pos = self._chain, self._chain_pos
        codes = _CODES
        i = pos.get(id(frame))
        if i is not None and chain[i][0] is frame:  # the usual: a kept frame calling again (see the walk)
            _, lasti, number, caller = chain[i]
            if frame.f_lasti != lasti:
                lasti = frame.f_lasti
                known = codes.get(id(frame.f_code)) or _code_info(frame.f_code)
                number = caller if known[1] else _numbered(caller, known[3], lasti)
                chain[i] = (frame, lasti, number, caller)
            if i + 1 < len(chain):
                for gone in chain[i + 1 :]:
                    pos.pop(id(gone[0]), None)
                del chain[i + 1 :]
            return number
        numbers = _NUMBERS
        walked: list[tuple[FrameType, _Code]] = []
        number = -1  # the number of the outermost walked frame's caller
        f: FrameType | None = frame
        while f is not None:
            code = f.f_code
            known = codes.get(id(code)) or _code_info(code)
            if known[2]:  # only a frame that can be kept is looked for among the kept ones
                i = pos.get(id(f))
                if i is not None and chain[i][0] is f:  # kept and still running: its callers are unchanged
                    _, lasti, number, caller = chain[i]
                    if f.f_lasti != lasti:  # moved on to another call: only its own pair changed
                        lasti = f.f_lasti
                        number = caller if known[1] else _numbered(caller, known[3], lasti)
                        chain[i] = (f, lasti, number, caller)
                    if i + 1 < len(chain):  # the frames it called before have returned
                        for gone in chain[i + 1 :]:
                            pos.pop(id(gone[0]), None)
                        del chain[i + 1 :]
                    break
            walked.append((f, known))
            f = f.f_back
        else:
            chain.clear()
            pos.clear()
        for f, (_, tool, keep, cid) in reversed(walked):
            lasti = f.f_lasti
            caller = number
            if not tool:
                number = numbers.get((caller, cid, lasti)) or _numbered(caller, cid, lasti)
            if keep:
                pos[id(f)] = len(chain)
                chain.append((f, lasti, number, caller))
        return number

    def release_frames(self) -> None:
        """Drop the kept frames (they keep their locals alive): at a flush, when recording may pause."""
        self._chain.clear()
        self._chain_pos.clear()

    def snapshot(self) -> Stacks:
        """A copy that later recording cannot change (it only appends names and groups)."""
        return [(list(names), frames) for names, frames in self.groups]


def _numbered(caller: int, cid: int, lasti: int) -> int:
    """The number of (caller's number, code, offset), a new one if it has none."""
    key = (caller, cid, lasti)
    number = _NUMBERS.get(key)
    if number is None:
        number = _NUMBERS[key] = next(_counter)
    return number
