"""``PrecisionDebugger``: msprobe's three-line interface over Parity's capture (dump-format.md §1).

    debugger = PrecisionDebugger(dump_path="./dump", level="mix")
    for batch in loader:
        debugger.start(model); loss = model(batch).sum(); loss.backward(); debugger.stop(); debugger.step()

A process-wide singleton whose ``start``/``stop``/``step`` are classmethods, so they can be called from any
file. Output: ``dump_path/step{N}/rank{R}/`` (rank 0 unless torch.distributed is initialised), and the run's
environment in ``dump_path/parity_environment.json`` (read by ``parity upload``).
"""

from __future__ import annotations

import atexit
import gc
import logging
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from parity.client.api_mode import ApiMode, BackwardCapture, ReflectedOperators
from parity.client.config import DebuggerConfig, load_config
from parity.client.distributed import DistributedPatch
from parity.client.errors import CaptureError, ConfigError
from parity.client.modules import ModuleHooks
from parity.client.patched import PatchedFunctions
from parity.client.plan import fetch_plan
from parity.client.recorder import Recorder
from parity.client.run_metadata import write_environment
from parity.client.tensor_writer import BackgroundWriter
from torch import nn

__all__ = ["PrecisionDebugger", "seed_all"]

log = logging.getLogger(__name__)

#: The longest the debugger's construction waits for the server's answer (``server`` set): a server that
#: does not answer by then costs training nothing more (uploads are off, the exit warning says how to
#: upload the dump later).
SERVER_CHECK_S = 1.0


def seed_all(seed: int = 1234, mode: bool = False) -> None:
    """Seed python, numpy and torch; ``mode=True`` also asks torch for deterministic algorithms."""
    random.seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:  # numpy is optional for training scripts
        pass
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    torch.use_deterministic_algorithms(mode)
    if mode:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) inherits the mode and hooks: make them inert there.

    Its copy of the step's entries would never be flushed, so recording in it only costs time."""
    inst = PrecisionDebugger._instance
    if inst is not None and getattr(inst, "_initialised", False):
        inst.running = False
        inst._thaw_heap()
        inst._restore_gc()
        if inst._mode is not None:
            inst._mode.active = False
        inst.finished = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _current_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


class PrecisionDebugger:
    """Process-wide dump controller; see the module docstring."""

    _instance: PrecisionDebugger | None = None
    _lock = threading.Lock()
    _initialised: bool

    #: the collector's youngest-generation threshold while recording (see _freeze_heap)
    GC_YOUNG = 100_000

    def __new__(cls, *args: Any, **kwargs: Any) -> PrecisionDebugger:
        with cls._lock:
            if cls._instance is None:
                inst = super().__new__(cls)
                inst._initialised = False
                cls._instance = inst
            return cls._instance

    def __init__(
        self,
        config_path: str | os.PathLike[str] | None = None,
        task: str | None = None,
        dump_path: str | os.PathLike[str] | None = None,
        level: str | None = None,
        step: Any = None,
        *,
        server: str | None = None,
        run_name: str | None = None,
        project: str | None = None,
        tags: Any = None,
        token: str | None = None,
        plan: str | None = None,
    ) -> None:
        if self._initialised:  # msprobe: a second construction is a no-op
            return
        self.config: DebuggerConfig = load_config(
            config_path, task=task, dump_path=str(dump_path) if dump_path is not None else None, level=level,
            step=step, server=server, run_name=run_name, project=project, tags=tags, token=token, plan=plan,
        )  # fmt: skip
        if self.config.plan is not None:  # before anything is hooked: a plan that cannot be had stops here
            self.config = fetch_plan(self.config)
        self._initialised = True
        self.current_step = 0
        self.recorder: Recorder | None = None
        self.running = False
        self.finished = False  # past the last configured step: nothing more is ever dumped
        self._mode: ApiMode | None = None
        self._modules = ModuleHooks(self._active_recorder)
        self._dist = DistributedPatch(self._active_recorder)
        self._operators = ReflectedOperators()
        self._patched = PatchedFunctions(self._active_recorder)
        self._in_backward = BackwardCapture(lambda: self._mode)
        self._uploader: Any = None
        self._submitted: set[tuple[int, int]] = set()  # touched on the writer thread only
        self._writer: BackgroundWriter | None = None  # started with the first recorder
        self._froze = False  # start() froze the heap (gc.freeze) and stop() thaws it
        self._gc_thresholds: tuple[int, ...] | None = None  # the collector's thresholds before start()
        if self.config.server:
            try:
                self._uploader = self._start_uploader(self.config)
            except ConfigError:
                self._initialised = False  # the corrected construction that follows is not a no-op
                raise
        atexit.register(self._at_exit)

    @staticmethod
    def _start_uploader(cfg: DebuggerConfig) -> Any:
        """The uploader, made before training so that its check of the server (at most ``SERVER_CHECK_S``)
        refuses a wrong token or URL now, as a :class:`ConfigError`, instead of after the last step. Any
        other failure only turns uploads off: the dump on disk is what matters."""
        from parity.client.uploader import BackgroundUploader

        name = cfg.run_name or f"{cfg.dump_path.resolve().name}-{time.strftime('%Y%m%d-%H%M%S')}"
        try:
            return BackgroundUploader(cfg.server, run_name=name, project=cfg.project, tags=dict(cfg.tags),
                                      token=cfg.token, dump_root=cfg.dump_path.resolve(),
                                      planned_by=cfg.planned_by, check_s=SERVER_CHECK_S,
                                      close_at_exit=False)  # fmt: skip
        except ConfigError:
            raise
        except Exception as exc:  # best effort: never stop training over the upload
            log.warning("parity: uploads are off, the uploader could not start: %s", exc)
            return None

    # ------------------------------------------------------------------------------------------ helpers
    @classmethod
    def _get(cls) -> PrecisionDebugger:
        inst = cls._instance
        if inst is None or not inst._initialised:
            raise CaptureError("PrecisionDebugger() must be constructed before start/stop/step")
        return inst

    def _active_recorder(self) -> Recorder | None:
        return self.recorder if self.running else None

    def _step_enabled(self, rank: int) -> bool:
        cfg = self.config
        if self.finished:
            return False
        if cfg.steps is not None and self.current_step not in cfg.steps:
            return False
        return cfg.ranks is None or rank in cfg.ranks

    # --------------------------------------------------------------------------------------- public API
    @classmethod
    def start(cls, model: nn.Module | list[nn.Module] | tuple[nn.Module, ...] | None = None) -> None:
        """Start (or resume) dumping the current step; ``model`` is required at L0 and mix."""
        self = cls._get()
        cfg = self.config
        if cfg.level in ("L0", "mix") and model is None:
            raise CaptureError(f"level {cfg.level} records modules: pass the model, start(model)")
        if self.running:
            return
        rank = _current_rank()
        if not self._step_enabled(rank):
            return
        if self.recorder is None or self.recorder.rank != rank or self.recorder.step != self.current_step:
            if self.recorder is not None:
                self.recorder.close()
            if self._writer is None:
                self._writer = BackgroundWriter(max_host_bytes=cfg.host_buffer_mb << 20)
                # the run's environment beside the dump, for `parity upload`; off the training thread
                root = cfg.dump_path
                self._writer.submit_call(lambda: write_environment(root))
            self.recorder = Recorder(cfg, rank, self.current_step, self._writer)
        if model is not None and cfg.level in ("L0", "mix"):
            self._modules.attach(model)
        self.running = True
        self._freeze_heap()
        if cfg.level in ("L1", "mix"):
            self._dist.install()
            self._operators.install()
            self._patched.install()
            self._in_backward.install()
            self._mode = ApiMode(self.recorder)
            self._mode.__enter__()

    @classmethod
    def stop(cls) -> None:
        """Stop dumping and queue what the step holds so far for writing (start may follow in this step)."""
        self = cls._get()
        if not self.running:
            return
        self.running = False
        self._thaw_heap()
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        self._dist.restore()
        self._operators.restore()
        self._patched.restore()
        self._in_backward.restore()
        if self.recorder is not None:
            self.recorder.flush()
            self._settle()

    @classmethod
    def save(cls, variable: Any, name: str, save_backward: bool = True) -> None:
        """msprobe 26's ``PrecisionDebugger.save(variable, name, save_backward=True)``: it records only at
        ``level: "debug"`` (into debug.json) and does nothing at any other level. Parity refuses level debug
        at construction, so here it records nothing either, as msprobe would at this level, and says so
        once instead of silently."""
        cls._get()  # as msprobe: the debugger must exist
        if not isinstance(name, str):
            raise ConfigError("save", f"name must be a string, got {type(name).__name__}")
        if not cls._save_warned:
            cls._save_warned = True
            log.warning("parity: PrecisionDebugger.save(%r) recorded nothing: save() writes debug.json only "
                        "at level \"debug\" (msprobe 26 does nothing at other levels too), which Parity "
                        "does not implement", name)  # fmt: skip

    _save_warned = False

    @classmethod
    def drain(cls) -> None:
        """Block until every flushed step is on disk (and handed to the uploader).

        Only needed with ``async_dump: true``, where ``stop()`` and ``step()`` queue their files for the
        background writer and return; without it they return once the files are written. Exit and
        :meth:`reset` drain on their own."""
        writer = cls._get()._writer
        if writer is not None:
            writer.drain()

    def _freeze_heap(self) -> None:
        """Keep the objects that exist at ``start()`` out of the garbage collector's passes until ``stop()``.

        A recorded step keeps a few objects alive per entry (the entry, its leaves, pending statistics),
        so the collector's full passes come every few thousand entries, and each walks every object of the
        process (a torch import alone is ~170k): that was the largest single host cost of capture (~25 us an
        entry on CPU). Frozen objects are only skipped, never freed, and return to the collector at
        ``stop()``; a process that froze its own heap (``gc.freeze()`` before forking) is left alone.

        The youngest generation's threshold is raised to GC_YOUNG meanwhile: a recorded call leaves a few
        objects that live until its backward or the flush, and at the default 700 the collector walked them
        again and again (about 5% of the host cost at L0). The user's thresholds are back at ``step()``, not
        ``stop()``: the step's entries and leaves live until ``step()`` hands them over, and the collection
        the old threshold triggers at once would walk every one of them (about 12% of the host cost). After
        the hand-over most are freed and it has little to walk. Cyclic garbage of the step waits a little
        longer for its collection."""
        self._froze = gc.get_freeze_count() == 0
        if self._froze:
            gc.freeze()
        if self._gc_thresholds is None:  # not a second start() in the step: the threshold is still raised
            self._gc_thresholds = gc.get_threshold()
            young, *older = self._gc_thresholds
            if 0 < young < self.GC_YOUNG:
                gc.set_threshold(self.GC_YOUNG, *older)

    def _thaw_heap(self) -> None:
        if self._froze:
            self._froze = False
            gc.unfreeze()

    def _restore_gc(self) -> None:
        """The user's thresholds back, once the step's documents are handed over and written (without
        ``async_dump``) and its objects mostly freed: the collection the old threshold then triggers has
        little to walk."""
        if self._gc_thresholds is not None:
            gc.set_threshold(*self._gc_thresholds)
            self._gc_thresholds = None

    def _settle(self) -> None:
        """``async_dump`` false (the default, as msprobe): wait until what was flushed is on disk.

        The tensor files were being written by the background thread while the step ran; here training
        waits for the rest and for the JSON files, so a process that ends right after ``step()`` (a crash,
        a launcher killing its workers, ``os._exit``) leaves the step complete."""
        if not self.config.async_dump and self._writer is not None:
            self._writer.drain()

    @classmethod
    def step(cls) -> None:
        """Finish the step: write its files (on disk when this returns, unless ``async_dump``), hand them to
        the uploader, reset counters, step += 1."""
        self = cls._get()
        was_running = self.running
        try:
            if was_running:
                cls.stop()
            self._finish_step()
            self._settle()
        finally:
            self._restore_gc()
        self.current_step += 1
        max_step = self.config.max_step
        if max_step is not None and self.current_step > max_step and not self.finished:
            self.finished = True
            self._modules.detach()
            log.info("parity: last configured step %d dumped; capture is off from now on", max_step)

    # ---------------------------------------------------------------------------------------- lifecycle
    def _finish_step(self) -> None:
        rec = self.recorder
        if rec is None or rec.step != self.current_step:
            return
        # final: catches API backward hooks that fired after stop() (§1.3); the uploader gets the directory
        # on the writer thread, once its files are completely written
        rec.flush(final=True, on_written=self._submit if self.config.server else None)
        rec.close()
        self.recorder = None

    def _submit(self, step: int, rank: int, rank_dir: Path) -> None:
        """Writer thread: hand one completely written rank directory to the uploader (once per step/rank)."""
        if self._uploader is None or (step, rank) in self._submitted:
            return
        self._submitted.add((step, rank))
        try:
            self._uploader.submit_rank_dir(step, rank, rank_dir)
        except Exception as exc:  # the upload is best effort: never break the training loop over it
            log.warning("parity: could not hand %s to the uploader: %s", rank_dir, exc)

    def _at_exit(self, exiting: bool = True) -> None:
        try:
            if exiting:  # not reset(): the person chose to end the dump there
                self._mark_cut_short()
            if self.running:
                type(self).stop()
            self._finish_step()
        except Exception as exc:  # interpreter shutdown: report, do not raise
            log.warning("parity: final flush failed: %s", exc)
        finally:
            self._restore_gc()
        if self._writer is not None:  # every queued file is written (and submitted) before the upload ends
            try:
                self._writer.close()
            except Exception as exc:
                log.warning("parity: finishing the dump files failed: %s", exc)
            self._writer = None
        if self._uploader is not None:
            try:
                self._uploader.close()
            except Exception as exc:
                log.warning("parity: closing the uploader failed: %s", exc)
            self._uploader = None

    def _mark_cut_short(self) -> None:
        """At exit, a step that ``step()`` did not end because the process raised (or ended while still
        recording) is written as it is, and marked incomplete beside its dump.json (``parity.shared.
        incomplete``): compared with a warning, never as a whole step."""
        rec = self.recorder
        if rec is None or rec.step != self.current_step:
            return
        raised = getattr(sys, "last_value", None)
        if raised is not None:
            reason = f"the process raised {type(raised).__name__}: {str(raised)[:200]} before step()"
        elif self.running:
            reason = "the process ended while the step was recording (neither stop() nor step() was called)"
        else:
            return
        from parity.shared.dump.layout import rank_dir_path
        from parity.shared.incomplete import mark_incomplete

        path = mark_incomplete(rank_dir_path(self.config.dump_path, rec.step, rec.rank), step=rec.step,
                               rank=rec.rank, reason=reason)  # fmt: skip
        log.warning("parity: step %d rank %d is incomplete, %s; marked so (%s)", rec.step, rec.rank,
                    reason.removeprefix("the process "), path)  # fmt: skip

    @classmethod
    def reset(cls) -> None:
        """Flush, remove every hook and forget the singleton (tests, or a second independent dump)."""
        inst = cls._instance
        if inst is not None and inst._initialised:
            inst._at_exit(exiting=False)
            inst._modules.detach()
            atexit.unregister(inst._at_exit)
        cls._instance = None
