"""The incremental reader (``stream_dump``, what the server's validation parses with) gives what ``load_dump``
gives: the same columns, or the same ``DumpError``, on the typed walk's whole corpus (fast, fallback, bad and
random documents), read in the server's 64 KiB pieces and in 7-byte pieces that split every token."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from parity.shared.dump import stream
from parity.shared.dump.reader import Dump, load_dump
from parity.shared.dump.stream import stream_dump
from parity.shared.errors import DumpError

from tests.shared.test_typed_walk import (
    _DOCS,
    BAD_DOCS,
    LAYOUTS,
    _fallback_cases,
    _fast_cases,
    _raw_doc,
    _raw_leaf,
    _write,
    assert_same_dump,
)


@pytest.fixture(params=[stream.CHUNK, 7], ids=["64KiB", "7B"])
def chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(stream, "CHUNK", request.param)
    return int(request.param)


def _outcome(read: Any, path: Path) -> Dump | str:
    try:
        return read(path)  # type: ignore[no-any-return]
    except DumpError as exc:
        return f"DumpError: {exc}"


def _assert_same(path: Path) -> None:
    streamed, whole = _outcome(stream_dump, path), _outcome(load_dump, path)
    if isinstance(streamed, Dump) and isinstance(whole, Dump):
        assert_same_dump(streamed, whole)
    else:
        assert streamed == whole


@pytest.mark.parametrize("text", [*_fast_cases(), *_fallback_cases()])
def test_same_dump_as_load_dump(tmp_path: Path, text: str | bytes, chunk: int) -> None:
    _assert_same(_write(tmp_path, text))


@pytest.mark.parametrize("text", [pytest.param(v, id=k) for k, v in BAD_DOCS.items()])
def test_same_error_as_load_dump(tmp_path: Path, text: str | bytes, chunk: int) -> None:
    path = _write(tmp_path, text)
    assert isinstance(_outcome(stream_dump, path), str)
    _assert_same(path)


def test_tokens_are_read_in_the_stream_not_reread(tmp_path: Path, chunk: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """NaN/Infinity tokens, a "NaN" string value and an entry with NaN in its name: streamed, never read whole
    (``load_dump`` is not called), and the same as ``load_dump``."""
    leaves = ", ".join(_raw_leaf(t) for t in ("NaN", "Infinity", "-Infinity", "1.5"))
    path = _write(tmp_path, _raw_doc(
        f'"Torch.nan_to_num.0.forward": {{"input_args": [{leaves}, {{"type": "str", "value": "NaN"}}]}}, '
        f'"Torch.f.1.forward": {{"output": [{_raw_leaf("-Infinity")}]}}'))  # fmt: skip
    whole = load_dump(path)
    monkeypatch.setattr(stream, "load_dump", lambda p: pytest.fail(f"{p} was read whole"))
    assert_same_dump(stream_dump(path), whole)


def test_a_large_malformed_file_names_file_and_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "RELOAD_LIMIT", 10)
    path = _write(tmp_path, '{"task": "statistics",\n "data": {"A.0.forward": {,}}}')
    with pytest.raises(DumpError, match=r"dump\.json: within the first \d+ bytes: malformed JSON: ") as err:
        stream_dump(path)
    assert err.value.file == str(path)


def test_missing_file(tmp_path: Path) -> None:
    assert _outcome(stream_dump, tmp_path / "dump.json") == _outcome(load_dump, tmp_path / "dump.json")


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("stream")


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_DOCS, layout=...)
def test_random_documents_read_the_same(scratch: Path, doc: dict[str, Any], layout: bool) -> None:
    with tempfile.TemporaryDirectory(dir=scratch) as directory:
        text = LAYOUTS["indent1" if layout else "compact"](doc)
        _assert_same(_write(Path(directory), text))
