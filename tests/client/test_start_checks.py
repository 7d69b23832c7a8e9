"""Mistakes caught when ``PrecisionDebugger`` is made, before training: tags, run name and project by the
server's own rule (``parity.shared.naming``), the server URL and the token (``token`` a config field,
``PARITY_TOKEN`` beside it). Reaching the server is the uploader's check (tests/e2e/test_start_checks.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from parity.client import PrecisionDebugger
from parity.client.config import load_config
from parity.client.errors import ConfigError


@pytest.fixture(autouse=True)
def no_server_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PARITY_SERVER", raising=False)
    monkeypatch.delenv("PARITY_TOKEN", raising=False)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"tags": {"note": "x" * 2000}}, "field 'tags': tag 'note': the value has 2000 characters, at most"),
        ({"tags": {f"k{i}": "v" for i in range(65)}}, "field 'tags': 65 tags, at most 64 allowed"),
        ({"tags": {"a=b": "c"}}, "field 'tags': tag 'a=b': a key holds no '='"),
        ({"run_name": "  nightly 4 / x  "}, "field 'run_name': 'nightly 4 / x' holds a '/'"),
        ({"run_name": "a\nb"}, "field 'run_name': holds the control character U+000A"),
        ({"project": ".."}, "field 'project': '..' is removed from URL paths"),
        ({"server": "localhost:8000"}, "field 'server': 'localhost:8000': expected an http:// or https://"),
        ({"server": "http://h:8000?x=1"}, "field 'server': 'http://h:8000?x=1': a server URL holds no '?'"),
        ({"token": "two words"}, "field 'token': the token (9 characters) holds a space"),
    ],
)
def test_a_mistake_fails_at_construction_naming_the_field(
    tmp_path: Path, arguments: dict, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        PrecisionDebugger(dump_path=str(tmp_path), level="L1", **arguments)
    assert message in str(info.value)
    assert "two words" not in str(info.value)  # a token is never quoted
    assert not PrecisionDebugger._instance or not PrecisionDebugger._instance._initialised


def test_names_and_tags_are_trimmed_as_the_server_would() -> None:
    cfg = load_config(run_name="  nightly 4  ", project=" mlp ", tags={" hw ": " gpu ", "lr": 0.1})
    assert (cfg.run_name, cfg.project, dict(cfg.tags)) == ("nightly 4", "mlp", {"hw": "gpu", "lr": "0.1"})


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("http://parity:8000/api/v1", "http://parity:8000"),
        ("http://parity:8000/api/v1/", "http://parity:8000"),
        (" https://parity.example/team/ ", "https://parity.example/team"),
    ],
)
def test_the_server_url_is_its_base(given: str, used: str) -> None:
    assert load_config(server=given).server == used


def test_token_is_a_config_field_and_parity_token_fills_it_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"task": "statistics", "token": "from-file\n"}))
    assert load_config(path).token == "from-file"  # a token pasted with its newline
    assert load_config(path, token="from-argument").token == "from-argument"
    monkeypatch.setenv("PARITY_TOKEN", "from-env")
    assert load_config().token == "from-env"
    assert load_config(path).token == "from-file"


def test_a_bad_server_from_the_environment_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARITY_SERVER", "parity:8000")
    with pytest.raises(ConfigError, match=r"^PARITY_SERVER: field 'server': 'parity:8000': expected an http"):
        load_config()
