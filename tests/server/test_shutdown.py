"""A server stops promptly on SIGTERM with clients connected and its worker pool running, also when the
signal reaches the whole process group (Ctrl-C, ``systemctl stop``) and kills idle workers first.

The cause of three e2e module teardowns that took 15 s each (``ServerProcess.stop``'s limit, then SIGKILL):
the idle workers slept on a ``multiprocessing.Event``, whose ``set`` waits for every sleeper to acknowledge;
a sleeper killed by the group's SIGTERM never does, so the server's next ``set`` (recovering that worker, or
any ``submit``) blocked for ever, and with it the shutdown.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
from parity.server.jobs.local import Bell

from tests.server.conftest import ServerProcess, build_dump, upload_run

STOP_WITHIN_S = 5.0


def _sleep_on(bell: Bell) -> None:
    while True:
        bell.wait(1.0)


def test_a_worker_killed_while_it_sleeps_on_the_bell_does_not_jam_the_next_ring() -> None:
    ctx = multiprocessing.get_context("spawn")
    bell = Bell(ctx, wakes=2)
    sleeper = ctx.Process(target=_sleep_on, args=(bell,), daemon=True)
    sleeper.start()
    try:
        bell.ring()  # a wake-up it takes, so it is known to be in its loop
        deadline = time.monotonic() + 60
        while bell._pending() == 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert bell._pending() < 2
    finally:
        sleeper.kill()
        sleeper.join()
    ringing = threading.Thread(target=bell.ring, daemon=True)
    ringing.start()
    ringing.join(5)
    assert not ringing.is_alive(), "ring() blocked after a sleeper died"
    for _ in range(100):  # rung while nobody listens: the pipe holds one wake-up per worker, not more
        bell.ring()
    assert bell._pending() == 2


def test_sigterm_to_the_process_group_stops_a_server_with_an_idle_client_and_running_workers(
    tmp_path: Path,
) -> None:
    srv = ServerProcess(tmp_path / "data", {"PARITY_WORKERS": "2"}).start()
    assert srv.proc is not None
    try:
        with srv.client() as api:
            upload_run(api, build_dump(tmp_path / "npu"))  # validated by a worker, which then sleeps
            workers = psutil.Process(srv.proc.pid).children()
            assert len(workers) >= 2, workers
            assert api.get("/runs").status_code == 200  # the keep-alive connection stays open, idle
            began = time.monotonic()
            os.killpg(srv.proc.pid, signal.SIGTERM)  # every process of the group at once, as Ctrl-C
            try:
                code = srv.proc.wait(timeout=STOP_WITHIN_S)
            except subprocess.TimeoutExpired:
                message = f"not stopped {STOP_WITHIN_S:g} s after SIGTERM:\n{srv.log()[-3000:]}"
                raise AssertionError(message) from None
            took = time.monotonic() - began
        # uvicorn (0.29 on) re-raises the SIGTERM it handled once shut down: the exit status is the signal's
        assert code in (0, -signal.SIGTERM), srv.log()[-3000:]
        assert "Application shutdown complete" in srv.log(), srv.log()[-3000:]  # graceful, not killed
        assert took < STOP_WITHIN_S
        assert _left(workers) == []
    finally:
        srv.stop()


def _left(children: list[psutil.Process]) -> list[psutil.Process]:
    """The server's children still alive a moment after it exited (its resource tracker leaves then)."""
    return psutil.wait_procs(children, timeout=STOP_WITHIN_S)[1]


def test_sigterm_to_the_server_stops_its_workers_and_cuts_a_stalled_request(tmp_path: Path) -> None:
    """The service manager's usual SIGTERM, to the server alone: it stops its own workers, and a request that
    never finishes (a client stalled mid-upload) does not hold the shutdown past its grace."""
    from parity.commands.server import GRACEFUL_SHUTDOWN_S

    srv = ServerProcess(tmp_path / "data", {"PARITY_WORKERS": "2"}).start()
    assert srv.proc is not None
    stalled, over = threading.Event(), threading.Event()
    uploader = None
    try:
        with srv.client() as api:
            run = api.post("/runs", json={"name": "stalled", "device": "npu"}).json()

        def body() -> Iterator[bytes]:
            yield b"x" * 1024
            stalled.set()
            over.wait(60)  # the rest never comes (until the test is over)

        def upload() -> None:
            headers = {"X-Content-SHA256": "0" * 64, "Content-Length": str(1 << 20)}
            with httpx.Client(base_url=f"{srv.url}/api/v1", timeout=90) as client:
                # Cut off by the shutdown (an httpx error), or short of its declared length once the test
                # ends (h11's own error): either way, what the test wants.
                with contextlib.suppress(Exception):
                    client.put(f"/runs/{run['id']}/files/step0/rank0/dump.json", content=body(),
                               headers=headers)  # fmt: skip

        uploader = threading.Thread(target=upload, daemon=True)
        uploader.start()
        assert stalled.wait(30)
        time.sleep(0.3)  # the server is reading that body now
        workers = psutil.Process(srv.proc.pid).children()
        began = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        limit = GRACEFUL_SHUTDOWN_S + STOP_WITHIN_S
        try:
            srv.proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"not stopped {limit:g} s after SIGTERM:\n{srv.log()[-3000:]}") from None
        assert time.monotonic() - began < limit
        assert _left(workers) == []
    finally:
        over.set()  # the uploader thread ends with this test, not during another one
        if uploader is not None:
            uploader.join(30)
        srv.stop()
