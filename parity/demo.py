"""``make demo``: the whole Parity flow on one machine in well under a minute.

1. start ``parity server`` on its embedded defaults (SQLite and a blob folder in a temporary data dir, a free
   port) as a subprocess;
2. train a tiny GELU MLP twice in subprocesses, each capturing with ``PrecisionDebugger(..., server=URL,
   run_name=...)`` and uploading from the background uploader: once in fp32 (the bench), once under bf16
   autocast (the target, as a lower-precision device would run it);
3. compare the two runs over REST, wait, download the xlsx report and the advisor into ``./demo-output``,
   print the top suspects and the report's path;
4. statistics first, then only the suspects in tensor mode (``parity.demo_plan``): a statistics run pair
   with a faulty GELU, their comparison, its plan, a tensor re-dump with it, the tensor comparison whose
   top suspect and float64 replay name the GELU;
5. say what to open and what to run next, and stop the server (``--keep-server``, which ``make demo`` passes,
   leaves it up on ``--port`` with its data in ``--data-dir`` and says how to stop it; without it no link
   to the stopped server is printed).

The fp32 run is made project ``demo``'s baseline, so the bf16 run's comparison is judged against it: the
runs list shows its verdict, and ``parity check`` gates on it. ``python -m parity.demo --data-dir
./parity-data`` keeps the server's data.
:class:`ServerProcess` is reused by the end-to-end tests and the server benchmark.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from parity.client.rest import ParityClient

log = logging.getLogger("parity.demo")

__all__ = ["ServerProcess", "free_port", "main"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it; a race with another process is unlikely)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """``parity server`` in a subprocess on a free port, with its log in ``{data_dir}/server.log``.

    ``env`` adds ``PARITY_*`` settings (database URL, tokens, workers) to ``base_env`` (by default this
    process's environment); the data dir is always ``data_dir``. :meth:`start` returns once ``/healthz``
    answers; :meth:`kill` is SIGKILL (to test crash recovery), :meth:`stop` a graceful SIGTERM.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        env: Mapping[str, str] | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.host = host
        self.port = port or free_port(host)
        self.env = dict(env or {})
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.log_path = self.data_dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "parity", "server", "--host", self.host, "--port", str(self.port)]

    def environment(self) -> dict[str, str]:
        """The server's whole environment (a Celery worker beside it is configured with the same)."""
        return {**self.base_env, "PARITY_DATA_DIR": str(self.data_dir), **self.env}

    def start(self, timeout: float = 60.0) -> str:
        """Start the server and wait until it is healthy; returns its base URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log_file:
            self.proc = subprocess.Popen(self.command(), env=self.environment(), stdout=log_file,
                                         stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"parity server exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return self.url
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"parity server not healthy after {timeout:g} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def _signal_group(self, sig: int) -> None:
        # The server's compare workers are its children: signal the whole session so none is left behind,
        # also once the server itself has exited (the group lives on while any member does).
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the server and its workers at once, as a crash would."""
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop gracefully, as a service manager does: SIGTERM to the server, which stops its workers
        itself and exits in about a second; SIGKILL what is left after ``timeout``."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("parity server still up %g s after SIGTERM; killed:\n%s", timeout, self.log_tail())
            self.kill()
        self._signal_group(signal.SIGKILL)  # stray workers of a server that exited first

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# -- the training script (run in a subprocess: ``python -m parity.demo train ...``) -----------------------


def train(
    dump_dir: Path, server: str, run_name: str, *, bf16: bool, steps: int = 2, project: str = "demo"
) -> None:
    """A tiny GELU MLP trained for ``steps`` steps, captured and uploaded by ``PrecisionDebugger``."""
    import torch
    from torch import nn

    from parity import PrecisionDebugger, seed_all

    seed_all(1234)
    debugger = PrecisionDebugger(
        task="tensor",
        dump_path=str(dump_dir),
        level="L1",
        server=server,
        run_name=run_name,
        project=project,
        tags={"precision": "bf16-autocast" if bf16 else "fp32"},
    )
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    target = torch.randn(8, 4, generator=torch.Generator().manual_seed(1))
    for _ in range(steps):
        debugger.start(model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = model(data)
        loss = ((out - target) ** 2).mean()  # bf16 - fp32 promotes to fp32: the same APIs in both runs
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        debugger.stop()
        debugger.step()


# -- the demo -------------------------------------------------------------------------------------------


def _run_training(dump_dir: Path, server: str, run_name: str, bf16: bool) -> None:
    cmd = [sys.executable, "-m", "parity.demo", "train", str(dump_dir), server, run_name]
    if bf16:
        cmd.append("--bf16")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"training {run_name} failed ({done.returncode}):\n{done.stderr[-3000:]}")


def _wait_complete(api: ParityClient, name: str, project: str, timeout: float = 60.0) -> str:
    """The id of run ``name`` once its uploader marked it complete (the training process's atexit does it)."""
    deadline = time.monotonic() + timeout
    while True:
        runs = api.find_runs(name=name, project=project)
        if runs and runs[0].status == "complete":
            return runs[0].id
        if time.monotonic() > deadline:
            state = runs[0].status if runs else "missing"
            raise RuntimeError(f"run {name} is {state} {timeout:g} s after training ended")
        time.sleep(0.2)


#: Where ``make demo``'s server writes its pid, for ``make demo-stop``.
PID_FILE = "server.pid"


def run_demo(out_dir: Path, data_dir: Path | None, *, keep_server: bool = False,
             port: int | None = None) -> Path:  # fmt: skip
    """The whole flow; returns the report's path."""
    from parity.client.reports import download_reports, summary_lines
    from parity.client.rest import ParityClient

    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="parity-demo-"))
    if port is not None and not _port_free(port):
        sys.stderr.write(f"demo: port {port} is taken; the server gets a free one\n")
        port = None
    server = ServerProcess(data_dir or tmp / "server-data", port=port, env={"PARITY_WORKERS": "1"})
    try:
        url = server.start()
        sys.stderr.write(f"demo: parity server on {url} (data in {server.data_dir})\n")
        stamp = time.strftime("%Y%m%d-%H%M%S")
        names = {"bench": f"demo-fp32-{stamp}", "target": f"demo-bf16-{stamp}"}
        _run_training(tmp / "dump-fp32", url, names["bench"], bf16=False)
        with ParityClient(url) as api:
            bench = _wait_complete(api, names["bench"], "demo")
            api.set_baseline(bench)  # the bf16 run is compared with it, and judged against it
        _run_training(tmp / "dump-bf16", url, names["target"], bf16=True)
        sys.stderr.write(f"demo: trained and uploaded {names['bench']} and {names['target']}\n")
        with ParityClient(url) as api:
            target = _wait_complete(api, names["target"], "demo")
            info = api.create_comparison(target, bench)  # the one auto-compare queued, or queued here
            info = api.wait_for_comparison(info.id, timeout=120)
            if info.status != "succeeded":
                raise RuntimeError(f"comparison {info.id} failed: {info.error}")
            paths = download_reports(api, info, out_dir)
            from parity.demo_plan import plan_demo

            plan_lines = plan_demo(api, url, tmp, out_dir, stamp, links=keep_server)
        sys.stdout.writelines(f"{line}\n" for line in summary_lines(info))
        sys.stdout.writelines(f"{line}\n" for line in plan_lines)
        report = next(p for p in paths if p.suffix == ".xlsx")
        for path in paths:
            sys.stdout.write(f"wrote {path}\n")
        sys.stdout.write(f"report: {report.resolve()}\n")
        sys.stdout.writelines(f"{line}\n" for line in next_lines(server, info.id, names, report,
                                                                  keep_server=keep_server))  # fmt: skip
        sys.stderr.write(f"demo: done in {time.monotonic() - start:.1f} s\n")
        return report
    except BaseException:
        keep_server = False  # a failed demo leaves nothing running
        raise
    finally:
        if keep_server and server.proc is not None:
            (server.data_dir / PID_FILE).write_text(f"{server.proc.pid}\n")
        else:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def next_lines(server: ServerProcess, comparison: str, names: Mapping[str, str], report: Path, *,
               keep_server: bool) -> list[str]:  # fmt: skip
    """What to open and run next: the report, the pages (only while the server is up), the ``parity``
    command (the venv's, which is not on the PATH unless the venv is activated)."""
    parity = Path(sys.executable).with_name("parity")
    here = Path.cwd()
    shown = parity.relative_to(here) if parity.is_relative_to(here) else parity
    lines = [f"next: open the report {report.resolve()} (or the advisor beside it)"]
    if keep_server:
        url = server.url
        pid = server.proc.pid if server.proc is not None else "?"
        lines += [
            f"next: open {url}/ (the runs, each with its verdict against the baseline) and "
            f"{url}/comparisons/{comparison} (bf16 against fp32)",
            f"next: the parity command is {shown} (or run: source {shown.parent}/activate), e.g.",
            f"        {shown} runs list --server {url} --project demo",
            f"        {shown} check {names['target']} --project demo --server {url}    # the CI gate; "
            "exit 1: this first comparison's failing APIs are new",
            f"next: the server keeps running (pid {pid}, data in {server.data_dir}); stop it with "
            f"make demo-stop (or kill {pid})",
        ]
    else:
        lines += [f"next: the parity command is {shown} (or run: source {shown.parent}/activate)",
                  "next: the server is stopped; python -m parity.demo --keep-server (make demo) leaves it "
                  "up to open its pages"]  # fmt: skip
    return lines


def _running_demo_server(data_dir: Path) -> int | None:
    """The pid of the server an earlier ``--keep-server`` demo left running on ``data_dir``, if it is up."""
    try:
        pid = int((data_dir / PID_FILE).read_text().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def _port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args[:1] == ["train"]:
        p = argparse.ArgumentParser(prog="python -m parity.demo train")
        p.add_argument("dump_dir", type=Path)
        p.add_argument("server")
        p.add_argument("run_name")
        p.add_argument("--bf16", action="store_true")
        t = p.parse_args(args[1:])
        train(t.dump_dir, t.server, t.run_name, bf16=t.bf16)
        return 0
    parser = argparse.ArgumentParser(prog="python -m parity.demo", description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, default=Path("demo-output"), help="report folder")
    parser.add_argument("--data-dir", type=Path, default=None, help="server data dir (default: a temp dir)")
    parser.add_argument("--keep-server", action="store_true",
                        help="leave the server running afterwards (its pid in DATA_DIR/server.pid)")
    parser.add_argument("--port", type=int, default=None,
                        help="the server's port (default: a free one; a taken one falls back to a free one)")
    a = parser.parse_args(args)
    if a.keep_server and a.data_dir is None:
        parser.error("--keep-server needs --data-dir (a server left running keeps its data there)")
    running = _running_demo_server(a.data_dir) if a.data_dir is not None else None
    if running is not None:
        parser.error(f"a demo server is still running on {a.data_dir} (pid {running}): make demo-stop "
                     f"(or kill {running}) first")  # fmt: skip
    run_demo(a.output, a.data_dir, keep_server=a.keep_server, port=a.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
