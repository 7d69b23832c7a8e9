"""What a replay found, per side and for the pair, and the one sentence that says it.

Each side is judged against its own replay (``SideReplay``: its distance, the rounding allowance, or why it
was not replayed); :func:`verdict_of` puts the two together::

    target output 2.1e-02 from its float64 replay, bench 3.0e-08 (rounding allows 1.9e-06: float32, K=16):
    the target's kernel is wrong
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from enum import Enum

__all__ = ["ReplayVerdict", "SideReplay", "Verdict", "verdict_of"]


class Verdict(str, Enum):
    """Which side's kernel the replay blames."""

    TARGET = "target"  # the target's output is off its replay, the bench's is not
    BENCH = "bench"
    BOTH = "both"
    NEITHER = "neither"  # both within rounding: the difference comes from the inputs
    #: both within their own rounding from identical inputs: the difference is the formats they compute in
    PRECISION = "precision"
    #: with the bench's arguments, the target's inputs give the bench's output: the arguments are the cause
    ARGUMENTS = "arguments"
    UNDECIDED = "undecided"  # one side replayed and within rounding, the other not replayed
    NOT_REPLAYED = "not-replayed"


@dataclass(frozen=True, slots=True)
class SideReplay:
    """One side's replay: how far its recorded output is from float64, or why it was not replayed."""

    side: str  # "target" or "bench"
    distance: float | None = None  # ||recorded - replay|| / ||replay||, over the floating outputs
    allowance: float | None = None
    reduction_length: int | None = None
    dtype: str | None = None  # the coarsest floating dtype the call wrote
    refusal: str | None = None
    #: the level the call's class differs by on this side's device (its other calls' replays, or the
    #: pair's systematic finding), within the allowance: that much is the class's, no fault of this call
    level: float | None = None
    #: the coarser format (``float16``) every value of its output fits while its inputs' do not
    #: (``replay.precision``): the kernel computed in that format
    held: str | None = None

    @property
    def replayed(self) -> bool:
        return self.distance is not None

    @property
    def off(self) -> bool:
        """The recorded output is farther from its replay than rounding allows."""
        if self.distance is None or self.allowance is None:
            return False
        return not self.distance <= self.allowance  # a NaN distance is off

    def as_dict(self) -> dict[str, object]:
        return {"distance": _finite(self.distance), "allowance": self.allowance, "dtype": self.dtype,
                "reduction_length": self.reduction_length, "refusal": self.refusal,
                "level": self.level, "held": self.held}  # fmt: skip


@dataclass(frozen=True, slots=True)
class ReplayVerdict:
    """The replay of one entry on both sides and what it says: the one verdict type, which the replay
    fills and the compare's judgement (``compare.replay_judgement``) and its advisor read."""

    entry: str
    direction: str
    verdict: Verdict
    target: SideReplay
    bench: SideReplay
    text: str
    #: the target's inputs replayed with the bench's arguments, judged by the bench's output (where the
    #: target asked for other arguments)
    asked: SideReplay | None = None
    #: what the target asked for that the bench did not, in words, and whether the inputs agree: what the
    #: verdict was given (a verdict judged again keeps them)
    arguments: str | None = None
    identical: bool = False

    @property
    def api(self) -> str:
        """The entry replayed (``Functional.linear.2.forward``), as the suspects name it."""
        return self.entry

    @property
    def wrong(self) -> str | None:
        """Whose kernel alone is wrong: ``"target"``, ``"bench"``, or None (both, neither, undecided)."""
        return self.verdict.value if self.verdict in (Verdict.TARGET, Verdict.BENCH) else None

    def as_dict(self) -> dict[str, object]:
        """Plain JSON values (the summary file, the server)."""
        return {
            "entry": self.entry, "direction": self.direction, "verdict": self.verdict.value,
            "text": self.text,
            "target": self.target.as_dict(), "bench": self.bench.as_dict(),
            **({"asked": self.asked.as_dict()} if self.asked is not None else {}),
        }  # fmt: skip


def _finite(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return "nan" if value != value else "inf"


def _what(direction: str) -> str:
    return "input gradients" if direction == "backward" else "output"


def _side_text(s: SideReplay, what: str) -> str:
    if s.distance is None:
        return f"{s.side} not replayed ({s.refusal})"
    return f"{s.side} {what} {s.distance:.1e} from its float64 replay"


def _allows(s: SideReplay) -> str:
    if s.level:
        return (f"rounding and its class's level {s.level:.1e} allow {s.allowance:.1e}: {s.dtype}, "
                f"K={s.reduction_length}")  # fmt: skip
    return f"rounding allows {s.allowance:.1e}: {s.dtype}, K={s.reduction_length}"


def verdict_of(entry: str, direction: str, target: SideReplay, bench: SideReplay, *,
               asked: SideReplay | None = None, arguments: str | None = None,
               identical: bool = False) -> ReplayVerdict:  # fmt: skip
    """What the two sides' replays say together, in one sentence. ``asked``: the target's inputs replayed
    with the bench's arguments, judged by the bench's output, where the target asked for other ``arguments``
    (in words); ``identical``: the two sides' inputs agree."""
    verdict = dataclasses.replace(_verdict_of(entry, direction, target, bench, identical), asked=asked,
                                  arguments=arguments, identical=identical)  # fmt: skip
    if asked is None or arguments is None:
        return verdict
    what = _what(direction)
    if asked.distance is None:
        note = f"; with the bench's arguments not replayed ({asked.refusal})"
        return dataclasses.replace(verdict, text=verdict.text + note)
    allowed = asked.allowance if asked.allowance is not None else 0.0
    fits = asked.distance <= max(allowed, bench.allowance or 0.0)
    head = (f"with the bench's arguments the target's inputs give an {what} {asked.distance:.1e} from the "
            f"bench's (rounding allows {allowed:.1e})")  # fmt: skip
    if fits and verdict.verdict is not Verdict.BENCH:
        text = f"{head}: within rounding, so {arguments} is the cause"
        return dataclasses.replace(verdict, verdict=Verdict.ARGUMENTS, text=text)
    return dataclasses.replace(verdict, text=f"{verdict.text}; {head}: the arguments are not all of it")


def _verdict_of(entry: str, direction: str, target: SideReplay, bench: SideReplay,
                identical: bool) -> ReplayVerdict:  # fmt: skip
    what = _what(direction)
    if not target.replayed and not bench.replayed:
        same = target.refusal == bench.refusal or bench.refusal is None
        why = target.refusal if same else f"target: {target.refusal}; bench: {bench.refusal}"
        return ReplayVerdict(entry, direction, Verdict.NOT_REPLAYED, target, bench, f"not replayed: {why}")
    shown = target if target.replayed else bench
    if target.replayed and bench.replayed:
        head = f"{_side_text(target, what)}, bench {bench.distance:.1e} ({_allows(shown)})"
    else:
        head = f"{_side_text(target, what)}; {_side_text(bench, what)} ({_allows(shown)})"
    # a side whose output holds only a coarser format's values, from inputs that do not, where the other
    # side's does not: computed in that format, whatever its distance. That holds for a call that rounds
    # nothing too (a 3-D linear's recorded backward is its view's, which hands on its incoming gradient
    # exactly, on a TF32 device as anywhere): values its inputs do not hold came from a narrower format.
    t_held = target.held is not None and bench.held != target.held
    b_held = bench.held is not None and target.held != bench.held
    if t_held or b_held:
        side = target if t_held else bench
        head += (f"; the {side.side}'s {what} holds {side.held} values only, from inputs that do not: "
                 f"computed in {side.held}")  # fmt: skip
    t_off, b_off = target.off or t_held, bench.off or b_held
    if t_off and b_off:
        verdict, tail = Verdict.BOTH, "both kernels are off their float64 replays"
    elif t_off:
        verdict, tail = Verdict.TARGET, "the target's kernel is wrong"
    elif b_off:
        verdict, tail = Verdict.BENCH, "the bench's kernel is wrong"
    elif target.replayed and bench.replayed and identical and target.dtype != bench.dtype:
        verdict = Verdict.PRECISION
        tail = (f"both kernels agree with float64 within their own rounding, from identical inputs: the "
                f"difference is the target's {target.dtype} against the bench's {bench.dtype}")  # fmt: skip
    elif target.replayed and bench.replayed and identical:
        verdict = Verdict.NEITHER
        tail = "both kernels agree with float64 within rounding, from identical inputs"
    elif target.replayed and bench.replayed:
        verdict = Verdict.NEITHER
        tail = "both kernels agree with float64 within rounding (the difference comes from their inputs)"
    else:
        verdict = Verdict.UNDECIDED
        tail = f"the {shown.side}'s kernel is within rounding; the other is not replayed"
    return ReplayVerdict(entry, direction, verdict, target, bench, f"{head}: {tail}")
