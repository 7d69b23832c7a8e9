"""A planned dump (``parity plan``'s config.json): tensor files for the listed calls only, statistics for all,
and the names and call indices of the statistics run; a plain msprobe ``list`` keeps msprobe's meaning."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from parity.client import PrecisionDebugger
from parity.client.config import apply_plan, load_config
from parity.client.errors import ConfigError

from tests.client.conftest import dump_once, load_data

LISTED = ["Functional.linear.1.forward", "Functional.linear.1.backward", "Functional.relu.0.forward"]


def tensor_config(**section: Any) -> dict[str, Any]:
    return {"task": "tensor", "tensor": {"scope": [], "list": LISTED, "data_mode": ["all"], **section}}


def data_names(data: dict[str, Any]) -> dict[str, list[str]]:
    """Each entry's tensor file names, read from its leaves."""
    out: dict[str, list[str]] = {}

    def walk(entry: str, value: Any) -> None:
        if isinstance(value, dict):
            if value.get("data_name"):
                out.setdefault(entry, []).append(value["data_name"])
            for v in value.values():
                walk(entry, v)
        elif isinstance(value, list):
            for v in value:
                walk(entry, v)

    for name, entry in data.items():
        walk(name, entry)
    return out


def test_planned_dump_writes_files_for_listed_calls_and_statistics_for_all(tmp_path: Path) -> None:
    statistics = load_data(dump_once(tmp_path / "stats", "mlp", "L1"))
    root = dump_once(tmp_path / "plan", "mlp", "L1", config=tensor_config(parity_statistics_for_all=True))
    planned = load_data(root)
    assert list(planned) == list(statistics)  # every call, named and numbered as the statistics run
    assert set(data_names(planned)) == set(LISTED)
    files = {p.name for p in (root / "step0" / "rank0" / "dump_tensor_data").iterdir()}
    assert files == {n for names in data_names(planned).values() for n in names}
    # an unlisted call keeps its statistics, without a file
    leaf = planned["Functional.linear.0.forward"]["output"][0]
    assert "data_name" not in leaf
    assert leaf["Max"] == statistics["Functional.linear.0.forward"]["output"][0]["Max"]


def test_plain_msprobe_list_keeps_only_the_listed_entries(tmp_path: Path) -> None:
    planned = load_data(dump_once(tmp_path, "mlp", "L1", config=tensor_config()))
    assert set(planned) == set(LISTED) | {"Functional.relu.0.backward"}  # a recorded forward's backward


def test_statistics_for_all_must_be_a_boolean(tmp_path: Path) -> None:
    config = tmp_path / "c.json"
    config.write_text('{"task": "tensor", "tensor": {"list": [], "parity_statistics_for_all": "yes"}}')
    with pytest.raises(ConfigError, match="tensor.parity_statistics_for_all.*true or false"):
        load_config(config)


def test_a_fetched_plan_is_applied_over_the_users_config(tmp_path: Path) -> None:
    user = load_config(None, task="statistics", level="L0", dump_path=str(tmp_path), step=[5], run_name="r")
    plan = {"task": "tensor", "level": "L1", "step": [2], "rank": [], "dump_path": "./elsewhere",
            "tensor": {"list": LISTED, "parity_statistics_for_all": True}}  # fmt: skip
    cfg = apply_plan(user, plan, "cmp1")
    assert (cfg.task, cfg.level, cfg.steps, cfg.ranks) == ("tensor", "L1", frozenset({2}), None)
    assert cfg.api_list == tuple(LISTED) and cfg.statistics_for_all and cfg.planned_by == "cmp1"
    assert cfg.dump_path == tmp_path and cfg.run_name == "r"  # where to dump and the name stay the user's
    with pytest.raises(ConfigError, match="not a tensor-task config"):
        apply_plan(user, {"task": "statistics"}, "cmp1")


def test_a_plan_without_a_server_stops_at_construction(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.delenv("PARITY_SERVER", raising=False)
    with pytest.raises(ConfigError, match="plan.*needs 'server'"):
        PrecisionDebugger(dump_path=str(tmp_path), plan="cmp1")


def test_compare_judges_a_planned_dumps_unlisted_calls_by_their_statistics(tmp_path: Path) -> None:
    from parity.shared.compare.engine import compare_dumps
    from parity.shared.compare.headers import full_header
    from parity.shared.compare.options import CompareOptions
    from parity.shared.compare.result import RowStatus

    from tests.replay_dumps import GELU, dump_model, wrong_forward_gelu

    config = tmp_path / "plan.json"
    config.write_text(json.dumps({"task": "tensor", "level": "L1", "tensor": {
        "list": [GELU, "Functional.gelu.0.backward", "Functional.layer_norm.0.forward"],
        "parity_statistics_for_all": True}}))  # fmt: skip
    bench = dump_model(tmp_path / "bench", config_path=str(config))
    target = dump_model(tmp_path / "target", gelu=wrong_forward_gelu(), config_path=str(config))
    result = compare_dumps(target, bench, CompareOptions())
    assert result.mode.value == "tensor" and result.suspects[0].api == GELU
    assert result.replay is not None and result.replay["verdicts"][0]["verdict"] == "target"
    assert result.missing_tensor_files == []
    header = full_header(result.mode, stack=False)
    message, cosine = header.index("Err_message"), header.index("Cosine")
    row = next(r for r in result.rows if r.cells[0] == "Functional.linear.0.forward.output.0")
    assert row.status is RowStatus.PASS and "Statistics only" in row.cells[message]
    assert row.cells[cosine] == "N/A"
    # the faulty gelu's output, saved on both sides, has its tensor metrics
    gelu_out = next(r for r in result.rows if r.cells[0] == f"{GELU}.output.0")
    assert isinstance(gelu_out.cells[cosine], float) and gelu_out.status is not RowStatus.PASS


def test_unlisted_calls_of_a_planned_dump_take_the_statistics_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only listed calls go through the tensor-file path (a file name, a submitted copy); every other call
    is encoded as a statistics dump encodes it."""
    from parity.client.recorder import Recorder

    seen: list[str] = []
    real = Recorder.tensor_leaf

    def spy(self: Recorder, t: Any, entry: str, category: str, path: tuple[int | str, ...]) -> Any:
        seen.append(entry)
        return real(self, t, entry, category, path)

    monkeypatch.setattr(Recorder, "tensor_leaf", spy)
    dump_once(tmp_path, "mlp", "L1", config=tensor_config(parity_statistics_for_all=True))
    assert seen and set(seen) <= set(LISTED)


def test_a_planned_dump_matches_items_that_are_no_entry_name_as_substrings(tmp_path: Path) -> None:
    """A hand-written plan may list ``relu`` (msprobe's substring match) beside full names."""
    statistics = load_data(dump_once(tmp_path / "stats", "mlp", "L1"))
    listed = ["relu", "Functional.linear.1.forward"]
    config = {"task": "tensor", "tensor": {"scope": [], "list": listed, "data_mode": ["all"],
                                           "parity_statistics_for_all": True}}  # fmt: skip
    planned = load_data(dump_once(tmp_path / "plan", "mlp", "L1", config=config))
    assert list(planned) == list(statistics)
    expected = {n for n in statistics if "relu" in n} | {"Functional.linear.1.forward"}
    assert set(data_names(planned)) == expected


def test_a_plan_is_bounded_input(tmp_path: Path) -> None:
    """Issue 37: a step range is kept as a range (four billion steps is no MemoryError in the debugger), an
    empty ``list`` pattern (it would match every call) is refused, and so is a plan answer past its size."""
    debugger = PrecisionDebugger(dump_path=str(tmp_path), task="statistics", step=["0-4000000000"])
    steps = debugger.config.steps
    assert steps is not None and len(steps) == 4_000_000_001 and 3_999_999_999 in steps
    assert debugger.config.max_step == 4_000_000_000 and 4_000_000_001 not in steps
    user = load_config(None, task="statistics", dump_path=str(tmp_path))
    for listed, words in (([""], r"tensor.list\[0\].*is empty: it would match every call"),
                          (["x", " "], r"tensor.list\[1\].*is empty"),
                          (["x"] * 10_001, "has 10,001 items; at most 10,000")):  # fmt: skip
        with pytest.raises(ConfigError, match=words):
            apply_plan(user, {"task": "tensor", "tensor": {"list": listed}}, "cmp1")
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"task": "statistics", "statistics": {"tensor_list": [""]}}))
    with pytest.raises(ConfigError, match=r"statistics.tensor_list\[0\].*is empty"):
        load_config(config)


def test_a_plan_answer_past_its_size_is_refused() -> None:
    """The training process never holds a plan answer bigger than ``MAX_PLAN_BYTES`` (a real HTTP server
    streaming an endless body: the client stops reading past the bound)."""
    import http.server
    import threading

    from parity.client.rest import MAX_PLAN_BYTES, ApiError, ParityClient

    class Endless(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            try:
                self.wfile.write(b'{"config": {"task": "tensor", "x": "')
                for _ in range(MAX_PLAN_BYTES // (1 << 20) + 8):
                    self.wfile.write(b"a" * (1 << 20))
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with ParityClient(f"http://127.0.0.1:{server.server_address[1]}") as api:
            with pytest.raises(ApiError, match=f"answer is over {MAX_PLAN_BYTES:,} bytes: refused"):
                api.get_plan("cmp1")
    finally:
        server.shutdown()
        server.server_close()
