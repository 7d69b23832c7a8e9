"""``parity upload`` and ``parity compare-runs`` against the in-memory fake server (no network)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
from parity.client.rest import ParityClient

from parity.cli import main
from tests.e2e.fake_server import FakeServer
from tests.factories import DumpBuilder


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeServer:
    server = FakeServer()
    server.polls_until_done = 2

    def make_client(args: object) -> ParityClient:
        return ParityClient("http://parity", client=server.client())

    monkeypatch.setattr("parity.commands.upload.make_client", make_client)
    return server


def write_rank(rank_dir: Path, scale: float = 1.0) -> Path:
    x = np.arange(6, dtype=np.float32).reshape(2, 3) * scale
    DumpBuilder("tensor").api("Torch.add.0.forward", [x, x], [x + x]).write(rank_dir)
    return rank_dir


def stored_paths(fake: FakeServer) -> dict[str, set[str]]:
    return {fake.runs[r]["name"]: set(files) for r, files in fake.files.items()}


def upload(*extra: str) -> int:
    return main(["upload", *extra, "--server", "http://parity"])


def test_parity_layout_uploads_every_step_and_rank(tmp_path: Path, fake: FakeServer, capsys) -> None:
    for step in (0, 1):
        for rank in (0, 1):
            write_rank(tmp_path / "dump" / f"step{step}" / f"rank{rank}")
    assert upload(str(tmp_path / "dump"), "--name", "a", "--tag", "k=v", "--device", "npu") == 0
    (run,) = fake.runs.values()
    assert run["status"] == "complete" and run["tags"] == {"k": "v"} and run["device"] == "npu"
    local = {
        p.relative_to(tmp_path / "dump").as_posix() for p in (tmp_path / "dump").rglob("*") if p.is_file()
    }
    assert stored_paths(fake)["a"] == local
    out, err = capsys.readouterr()
    assert out.strip() == run["id"]
    assert f"{len(local)}/{len(local)} files" in err


@pytest.mark.parametrize("folder", ["rank", "proc4242"])
def test_msprobe_unnumbered_rank_folder_is_rank0(tmp_path: Path, fake: FakeServer, folder: str) -> None:
    write_rank(tmp_path / "dump" / "step0" / folder)
    assert upload(str(tmp_path / "dump"), "--name", "m") == 0
    assert {p.split("/")[1] for p in stored_paths(fake)["m"]} == {"rank0"}


def test_unnumbered_folder_beside_numbered_ones_is_refused(tmp_path: Path, fake: FakeServer, capsys) -> None:
    write_rank(tmp_path / "dump" / "step0" / "rank")
    write_rank(tmp_path / "dump" / "step0" / "rank1")
    assert upload(str(tmp_path / "dump"), "--name", "m") == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "step0: cannot number its rank folders (rank, rank1)" in err
    assert fake.runs == {}


def test_step_dir_and_rank_dir_keep_their_numbers(tmp_path: Path, fake: FakeServer) -> None:
    write_rank(tmp_path / "dump" / "step3" / "rank0")
    write_rank(tmp_path / "dump" / "step3" / "rank2")
    write_rank(tmp_path / "other" / "step5" / "rank7")
    assert upload(str(tmp_path / "dump" / "step3"), "--name", "s") == 0
    assert upload(str(tmp_path / "other" / "step5" / "rank7"), "--name", "r") == 0
    paths = stored_paths(fake)
    assert {p.rsplit("/", 1)[0] for p in paths["s"] if p.endswith("dump.json")} == {
        "step3/rank0",
        "step3/rank2",
    }
    assert {p for p in paths["r"] if p.endswith("dump.json")} == {"step5/rank7/dump.json"}


def test_not_a_dump_is_one_line_error(tmp_path: Path, fake: FakeServer, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert upload(str(tmp_path / "empty"), "--name", "x") == 2
    assert "no step*/rank* folders" in capsys.readouterr().err
    assert upload(str(tmp_path / "missing"), "--name", "x") == 2
    assert "not a directory" in capsys.readouterr().err


def test_resume_sends_only_missing_files(tmp_path: Path, fake: FakeServer) -> None:
    root = tmp_path / "dump"
    write_rank(root / "step0" / "rank0")
    write_rank(root / "step0" / "rank1", scale=2.0)
    api = ParityClient("http://parity", client=fake.client())
    run = api.create_run("resume-me", project="p")
    first = root / "step0" / "rank0" / "dump_tensor_data" / "Torch.add.0.forward.input.0.pt"
    api.upload_file(run["id"], "step0/rank0/dump_tensor_data/Torch.add.0.forward.input.0.pt", first)
    fake.requests.clear()
    assert upload(str(root), "--name", "resume-me", "--project", "p") == 0
    assert len(fake.runs) == 1 and fake.runs[run["id"]]["status"] == "complete"
    puts = [p for m, p in fake.requests if m == "PUT"]
    local = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert len(puts) == len(set(puts)) == len(local) - 1
    assert set(fake.files[run["id"]]) == local


def test_resume_refuses_a_path_with_other_content(tmp_path: Path, fake: FakeServer, capsys) -> None:
    root = tmp_path / "dump"
    write_rank(root / "step0" / "rank0")
    other = tmp_path / "other.json"
    other.write_text("{}")
    api = ParityClient("http://parity", client=fake.client())
    run = api.create_run("clash")
    api.upload_file(run["id"], "step0/rank0/dump.json", other)
    assert upload(str(root), "--name", "clash") == 2
    err = capsys.readouterr().err
    assert "step0/rank0/dump.json: run" in err and "other content" in err
    assert fake.runs[run["id"]]["status"] == "uploading"


def _two_runs(tmp_path: Path, ranks: tuple[int, ...]) -> None:
    for name, scale in (("npu", 1.0), ("gpu", 1.01)):
        for rank in ranks:
            write_rank(tmp_path / name / "step0" / f"rank{rank}", scale)
        assert upload(str(tmp_path / name), "--name", f"run-{name}") == 0


def test_compare_runs_by_name_waits_and_downloads(tmp_path: Path, fake: FakeServer, capsys) -> None:
    _two_runs(tmp_path, (0,))
    capsys.readouterr()
    out_dir = tmp_path / "out"
    assert (
        main(
            ["compare-runs", "run-npu", "run-gpu", "--server", "http://parity", "--wait", "-o", str(out_dir)]
        )
        == 0
    )
    (comparison,) = fake.comparisons.values()
    ids = {r["name"]: r["id"] for r in fake.runs.values()}
    assert (comparison["target_run"], comparison["bench_run"]) == (ids["run-npu"], ids["run-gpu"])
    files = sorted(p.name for p in out_dir.iterdir())
    assert len(files) == 2
    assert (
        files[0].startswith("advisor_")
        and files[1].startswith("compare_result_")
        and files[1].endswith(".xlsx")
    )
    assert (out_dir / files[1]).read_bytes().startswith(b"report.xlsx of")
    out = capsys.readouterr().out
    assert "1. Functional.gelu.0.forward (forward, rank 0): output differs" in out


def test_compare_runs_multi_rank_downloads_per_rank(tmp_path: Path, fake: FakeServer) -> None:
    _two_runs(tmp_path, (0, 1))
    out_dir = tmp_path / "out"
    assert main(["compare-runs", "run-npu", "run-gpu", "--server", "x", "--wait", "-o", str(out_dir)]) == 0
    names = sorted(p.name for p in out_dir.iterdir())
    assert [n.split("_")[:3] for n in names if n.endswith(".xlsx")] == [
        ["compare", "result", "rank0"],
        ["compare", "result", "rank1"],
    ]
    assert (out_dir / names[-1]).read_bytes().endswith(b"rank 1")


def test_compare_runs_ambiguous_name_lists_ids(tmp_path: Path, fake: FakeServer, capsys) -> None:
    api = ParityClient("http://parity", client=fake.client())
    a = api.create_run("dup", project="p1")
    b = api.create_run("dup", project="p2")
    assert main(["compare-runs", "dup", b["id"], "--server", "x"]) == 2
    err = capsys.readouterr().err
    assert "ambiguous" in err and a["id"] in err and b["id"] in err
    assert fake.comparisons == {}


def test_compare_runs_without_wait_prints_the_id(tmp_path: Path, fake: FakeServer, capsys) -> None:
    _two_runs(tmp_path, (0,))
    capsys.readouterr()
    ids = [r["id"] for r in fake.runs.values()]
    assert main(["compare-runs", *ids, "--server", "x", "--step", "0", "--rank", "0"]) == 0
    (comparison,) = fake.comparisons.values()
    assert capsys.readouterr().out.strip() == comparison["id"]
    assert comparison["step"] == 0 and comparison["ranks"] == [0]


def test_sha256_file_matches_hashlib(tmp_path: Path) -> None:
    from parity.client.rest import sha256_file

    blob = tmp_path / "b"
    blob.write_bytes(np.random.default_rng(0).bytes(3 * (1 << 20) + 17))
    assert sha256_file(blob) == hashlib.sha256(blob.read_bytes()).hexdigest()
