"""``parity upload`` and ``parity compare-runs`` against the real app in process (no network, no fake)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from parity.client.rest import ParityClient

from parity.cli import main
from tests.e2e.app_wire import AppWire, app_wire
from tests.e2e.conftest import write_model_dump
from tests.factories import DumpBuilder


@pytest.fixture
def wire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppWire]:
    """The app with no compare worker (uploads only); the commands talk to it through the wire."""
    with app_wire(tmp_path / "server", workers=0) as w:
        monkeypatch.setattr("parity.commands.server_args.connect", lambda args: w.api())
        yield w


@pytest.fixture
def api(wire: AppWire) -> ParityClient:
    return wire.api()


def write_rank(rank_dir: Path, scale: float = 1.0) -> Path:
    x = np.arange(6, dtype=np.float32).reshape(2, 3) * scale
    DumpBuilder("tensor").api("Torch.add.0.forward", [x, x], [x + x]).write(rank_dir)
    return rank_dir


def local_files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def stored(api: ParityClient, name: str) -> set[str]:
    (run,) = api.find_runs(name=name)
    return {f.path for f in api.list_files(run.id)}


def upload(*extra: str) -> int:
    return main(["upload", *extra, "--server", "http://parity"])


def test_parity_layout_uploads_every_step_and_rank(
    tmp_path: Path, wire: AppWire, api: ParityClient, capsys
) -> None:
    for step in (0, 1):
        for rank in (0, 1):
            write_rank(tmp_path / "dump" / f"step{step}" / f"rank{rank}")
    assert upload(str(tmp_path / "dump"), "--name", "a", "--tag", "k=v", "--device", "npu") == 0
    (run,) = api.find_runs(name="a")
    assert run.status == "complete" and run.tags == {"k": "v"} and run.device == "npu"
    assert run.steps == [0, 1] and run.ranks == [0, 1]
    local = local_files(tmp_path / "dump")
    assert stored(api, "a") == local
    out, err = capsys.readouterr()
    assert out.strip() == run.id
    assert f"{len(local)}/{len(local)} files" in err
    # every dump.json goes after every tensor file, so a stored dump.json always finds its tensors
    puts = [p.endswith("/dump.json") for m, p in wire.requests if m == "PUT"]
    assert puts == sorted(puts) and puts.count(True) == 4


@pytest.mark.parametrize("folder", ["rank", "proc4242"])
def test_msprobe_unnumbered_rank_folder_is_rank0(tmp_path: Path, api: ParityClient, folder: str) -> None:
    write_rank(tmp_path / "dump" / "step0" / folder)
    assert upload(str(tmp_path / "dump"), "--name", "m") == 0
    assert {p.split("/")[1] for p in stored(api, "m")} == {"rank0"}


def test_unnumbered_folder_beside_numbered_ones_is_refused(
    tmp_path: Path, api: ParityClient, capsys
) -> None:
    write_rank(tmp_path / "dump" / "step0" / "rank")
    write_rank(tmp_path / "dump" / "step0" / "rank1")
    assert upload(str(tmp_path / "dump"), "--name", "m") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "step0: cannot number its rank folders (rank, rank1)" in err
    assert api.find_runs() == []


def test_step_dir_and_rank_dir_keep_their_numbers(tmp_path: Path, api: ParityClient) -> None:
    write_rank(tmp_path / "dump" / "step3" / "rank0")
    write_rank(tmp_path / "dump" / "step3" / "rank2")
    write_rank(tmp_path / "other" / "step5" / "rank7")
    assert upload(str(tmp_path / "dump" / "step3"), "--name", "s") == 0
    assert upload(str(tmp_path / "other" / "step5" / "rank7"), "--name", "r") == 0
    assert {p.rsplit("/", 1)[0] for p in stored(api, "s") if p.endswith("dump.json")} == {
        "step3/rank0",
        "step3/rank2",
    }
    assert {p for p in stored(api, "r") if p.endswith("dump.json")} == {"step5/rank7/dump.json"}


def test_not_a_dump_is_one_line_error(tmp_path: Path, api: ParityClient, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert upload(str(tmp_path / "empty"), "--name", "x") == 2
    assert "no step*/rank* folders" in capsys.readouterr().err
    assert upload(str(tmp_path / "missing"), "--name", "x") == 2
    assert "not a directory" in capsys.readouterr().err
    assert api.find_runs() == []


def test_a_dump_the_server_refuses_is_one_line_naming_file_and_entry(
    tmp_path: Path, api: ParityClient, capsys
) -> None:
    """``complete`` answers at once; ``parity upload`` waits for the server's workers to validate the run and
    prints their error when it is invalid; the run stays on the server as ``invalid``."""
    write_rank(tmp_path / "dump" / "step0" / "rank0")
    rank1 = write_rank(tmp_path / "dump" / "step0" / "rank1")
    (rank1 / "dump.json").write_text('{"task": "tensor", "level": "L1", "data": {"Torch.add.0.forward": 5}}')
    capsys.readouterr()
    assert upload(str(tmp_path / "dump"), "--name", "bad") == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    problem = "step0/rank1/dump.json: entry 'Torch.add.0.forward': must be an object"
    assert f"is invalid: {problem}" in err, err
    (run,) = api.find_runs(name="bad")
    assert run.status == "invalid" and run.error == problem


def test_wait_0_returns_once_the_run_is_validating(tmp_path: Path, wire: AppWire, api: ParityClient) -> None:
    write_rank(tmp_path / "dump" / "step0" / "rank0")
    assert upload(str(tmp_path / "dump"), "--name", "nowait", "--wait", "0") == 0
    last = wire.requests[-1]
    (run,) = api.find_runs(name="nowait")
    # The command sent complete and read nothing after it; the workers finish the validation on their own.
    assert last == ("POST", f"/api/v1/runs/{run.id}/complete")
    assert run.status in ("validating", "complete")


def test_resume_sends_only_missing_files(tmp_path: Path, wire: AppWire, api: ParityClient) -> None:
    root = tmp_path / "dump"
    write_rank(root / "step0" / "rank0")
    write_rank(root / "step0" / "rank1", scale=2.0)
    run = api.create_run("resume-me", project="p")
    first = root / "step0" / "rank0" / "dump_tensor_data" / "Torch.add.0.forward.input.0.pt"
    api.upload_file(run.id, "step0/rank0/dump_tensor_data/Torch.add.0.forward.input.0.pt", first)
    wire.requests.clear()
    assert upload(str(root), "--name", "resume-me", "--project", "p") == 0
    (again,) = api.find_runs(name="resume-me")
    assert again.id == run.id and again.status == "complete"
    puts = [p for m, p in wire.requests if m == "PUT"]
    local = local_files(root)
    assert len(puts) == len(set(puts)) == len(local) - 1
    assert stored(api, "resume-me") == local


def test_resume_refuses_a_path_with_other_content(tmp_path: Path, api: ParityClient, capsys) -> None:
    root = tmp_path / "dump"
    write_rank(root / "step0" / "rank0")
    other = tmp_path / "other.json"
    other.write_text("{}")
    run = api.create_run("clash")
    api.upload_file(run.id, "step0/rank0/dump.json", other)
    assert upload(str(root), "--name", "clash") == 2
    err = capsys.readouterr().err
    assert "step0/rank0/dump.json: run" in err and "other content" in err
    assert api.get_run(run.id).status == "uploading"


def test_a_transient_failure_is_retried(tmp_path: Path, wire: AppWire, api: ParityClient) -> None:
    write_rank(tmp_path / "dump" / "step0" / "rank0")
    failed: list[str] = []

    def once(request: httpx.Request) -> httpx.Response | None:
        if request.method == "PUT" and not failed:
            failed.append(request.url.path)
            return httpx.Response(503, json={"detail": "busy"})
        return None

    wire.fail = once
    assert upload(str(tmp_path / "dump"), "--name", "flaky") == 0
    assert len(failed) == 1 and [p for m, p in wire.requests if m == "PUT"].count(failed[0]) == 2
    assert stored(api, "flaky") == local_files(tmp_path / "dump")


def test_bad_tag_and_missing_server_are_one_line_errors(tmp_path: Path, capsys) -> None:
    write_rank(tmp_path / "dump" / "step0" / "rank0")
    assert upload(str(tmp_path / "dump"), "--name", "t", "--tag", "novalue") == 2
    assert "--tag 'novalue': expected KEY=VALUE" in capsys.readouterr().err
    assert main(["upload", str(tmp_path / "dump"), "--name", "t", "--server", "localhost:1"]) == 2
    assert "expected an http:// or https:// URL" in capsys.readouterr().err


# -- compare-runs: the app's own compare worker ------------------------------------------------------------


@pytest.fixture
def worker_wire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppWire]:
    """The app with one compare worker process, for the commands that wait for a comparison."""
    with app_wire(tmp_path / "server", workers=1) as w:
        monkeypatch.setattr("parity.commands.server_args.connect", lambda args: w.api())
        yield w


def _two_runs(tmp_path: Path, ranks: tuple[int, ...]) -> None:
    for name, noise in (("npu", 0.05), ("gpu", 0.0)):
        write_model_dump(tmp_path / name, ranks=ranks, gelu_noise=noise)
        assert upload(str(tmp_path / name), "--name", f"run-{name}") == 0


def test_compare_runs_by_name_waits_downloads_and_names_the_suspect(
    tmp_path: Path, worker_wire: AppWire, capsys
) -> None:
    api = worker_wire.api()
    _two_runs(tmp_path, (0, 1))
    capsys.readouterr()
    out_dir = tmp_path / "out"
    argv = ["compare-runs", "run-npu", "run-gpu", "--server", "x", "--wait", "-o", str(out_dir)]
    assert main(argv) == 0
    (comparison,), _ = api.list_comparisons()
    ids = {r.name: r.id for r in api.find_runs()}
    assert (comparison.target_run, comparison.bench_run) == (ids["run-npu"], ids["run-gpu"])
    names = sorted(p.name for p in out_dir.iterdir())
    assert [n.split("_")[:3] for n in names if n.endswith(".xlsx")] == [
        ["compare", "result", "rank0"],
        ["compare", "result", "rank1"],
    ]
    assert len([n for n in names if n.startswith("advisor_rank")]) == 2
    assert all((out_dir / n).read_bytes()[:2] == b"PK" for n in names if n.endswith(".xlsx"))
    out = capsys.readouterr().out
    assert "Top suspects, by how far they stand above the background" in out  # the advisor's words
    assert "[forward] Functional.gelu.0.forward (score " in out


def test_compare_runs_ambiguous_name_lists_ids(api: ParityClient, capsys) -> None:
    a = api.create_run("dup", project="p1")
    b = api.create_run("dup", project="p2")
    assert main(["compare-runs", "dup", b.id, "--server", "x"]) == 2
    err = capsys.readouterr().err
    assert "ambiguous" in err and a.id in err and b.id in err
    assert api.list_comparisons() == ([], 0)


def test_compare_runs_refuses_an_incomplete_run(api: ParityClient, capsys) -> None:
    a = api.create_run("half")
    assert main(["compare-runs", "half", a.id, "--server", "x"]) == 2
    assert f"TARGET run {a.id} (half) is uploading, not complete" in capsys.readouterr().err


def test_compare_runs_without_wait_prints_the_id(tmp_path: Path, api: ParityClient, capsys) -> None:
    _two_runs(tmp_path, (0,))
    capsys.readouterr()
    ids = [r.id for r in api.find_runs(name="run-npu") + api.find_runs(name="run-gpu")]
    assert main(["compare-runs", *ids, "--server", "x", "--step", "0", "--rank", "0"]) == 0
    (comparison,), _ = api.list_comparisons()
    assert capsys.readouterr().out.strip() == comparison.id
    assert comparison.status == "queued" and comparison.step == 0 and comparison.ranks == [0]


def test_sha256_file_matches_hashlib(tmp_path: Path) -> None:
    from parity.client.rest import sha256_file

    blob = tmp_path / "b"
    blob.write_bytes(np.random.default_rng(0).bytes(3 * (1 << 20) + 17))
    assert sha256_file(blob) == hashlib.sha256(blob.read_bytes()).hexdigest()
