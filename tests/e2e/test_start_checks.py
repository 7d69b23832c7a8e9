"""``PrecisionDebugger`` against a real server that needs a token: a missing, wrong or read-only token and
a URL with no Parity API fail at construction, before training; a right one, given with the API's own
address (``.../api/v1``), uploads the steps with the environment written beside the dump, and ``parity
upload`` of the same folder sends that environment too."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from parity.client import PrecisionDebugger
from parity.client.errors import ConfigError
from parity.client.rest import ParityClient
from parity.client.run_metadata import ENVIRONMENT_FILE

from parity.cli import main
from parity.demo import ServerProcess
from tests.workers import validation_thread

RW, RO = "rw-token-0123456789abcdef0123456789", "ro-token-0123456789abcdef0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path_factory.mktemp("tokened"),
                         env={"PARITY_TOKENS": f"{RW}:rw:ci,{RO}:ro", "PARITY_WORKERS": "0"})  # fmt: skip
    proc.start()
    from parity.server.settings import Settings

    with validation_thread(Settings(data_dir=proc.data_dir)):  # the one validator, in this process
        yield proc
    proc.stop()


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("PARITY_TOKEN", raising=False)
    monkeypatch.delenv("PARITY_SERVER", raising=False)
    PrecisionDebugger.reset()
    yield
    PrecisionDebugger.reset()


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (None, "field 'token': the server needs one: set PARITY_TOKEN or the 'token' field"),
        ("wrong-token", "field 'token': the server refuses it (Authorization: unknown token"),
        (RO, "field 'token': the server takes it for reading only; uploads need a read-write token"),
    ],
)
def test_a_token_the_server_refuses_fails_before_training(
    server: ServerProcess, tmp_path: Path, token: str | None, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        PrecisionDebugger(dump_path=str(tmp_path), level="L1", server=server.url, token=token)
    assert message in str(info.value)
    assert RO not in str(info.value)  # never quoted
    assert not (tmp_path / "step0").exists()
    debugger = PrecisionDebugger(dump_path=str(tmp_path), level="L1", server=server.url, token=RW)
    assert debugger._uploader.offline is None  # corrected, the next construction takes effect


def test_a_url_with_no_parity_api_fails_before_training(server: ServerProcess, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"field 'server': .*/elsewhere has no Parity API \(POST .*404"):
        PrecisionDebugger(dump_path=str(tmp_path), level="L1", server=server.url + "/elsewhere", token=RW)


def test_the_api_address_and_a_config_token_upload_with_the_environment(
    server: ServerProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dump = tmp_path / "dump"
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"task": "statistics", "level": "L1", "token": RW}))
    PrecisionDebugger(str(config), dump_path=str(dump), server=server.url + "/api/v1/", run_name=" checked ",
                      project="starts", tags={"hw": "cpu"})  # fmt: skip
    for _ in range(2):
        PrecisionDebugger.start()
        torch.exp(torch.ones(3))
        PrecisionDebugger.step()
    PrecisionDebugger.reset()  # what exit does: the uploader finishes and completes the run
    environment = json.loads((dump / ENVIRONMENT_FILE).read_text())
    assert environment["device"] in ("cpu", "gpu", "npu") and "packages" in environment["metadata"]
    with ParityClient(server.url, token=RW) as api:
        (run,) = api.find_runs(name="checked", project="starts")
        assert run.status == "complete" and run.steps == [0, 1] and run.tags == {"hw": "cpu"}
        assert run.metadata["packages"] == environment["metadata"]["packages"]
        # the same folder through `parity upload`: the environment goes too, and its device is the default
        argv = ["upload", str(dump), "--server", server.url, "--token", RW, "--name", "again", "--project",
                "starts", "-q"]  # fmt: skip
        assert main(argv) == 0, capsys.readouterr().err
        (again,) = api.find_runs(name="again", project="starts")
        assert again.device == environment["device"]
        assert again.metadata["packages"] == environment["metadata"]["packages"]
        assert again.metadata["source"] == "parity upload"
        assert {f.path for f in api.list_files(again.id)} == {f.path for f in api.list_files(run.id)}
