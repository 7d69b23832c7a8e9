"""The pure parts behind the pages: metric cells to numbers, rows to calls, the guess throttle and tokens, the
environment difference, safe redirects and shareable URLs."""

from __future__ import annotations

import json

import pytest
from parity.server.errors import BadRequest, TooManyRequests
from parity.server.security.throttle import GuessThrottle
from parity.server.security.tokens import TokenRegistry
from parity.server.services.baselines import environment_diff
from parity.server.services.calls import first_divergence, parse_error, summarize_rows
from parity.server.settings import parse_token_entries
from parity.server.web.routes import _parse_tags, _safe_next, query_url

HEADER = ["NPU Name", "Bench Name", "Cosine", "MaxRelativeErr", "Parity Status"]


@pytest.mark.parametrize(
    ("cell", "value"),
    [(0.5, 0.5), (-2.0, 2.0), ("12.5%", 0.125), ("3e-3", 0.003), ("N/A", None), ("Nan", None),
     ("unsupported", None), (float("inf"), None), (None, None), (True, None)],
)  # fmt: skip
def test_parse_error(cell: object, value: float | None) -> None:
    assert parse_error(cell) == value


Row = tuple[int, str, str, str, str]


def row(index: int, api: str, suffix: str, status: str, cos: object, rel: object) -> Row:
    name = f"{api}.{suffix}"
    return index, api, status, name, json.dumps([name, name, cos, rel, status])


def test_calls_take_the_error_of_their_outputs_and_the_worst_status() -> None:
    rows = [
        row(0, "Torch.add.0.forward", "input.0", "fail", 0.5, 9.0),  # a bad input does not make a bad call
        row(1, "Torch.add.0.forward", "output.0", "pass", 0.999, 1e-4),
        row(2, "Torch.add.0.forward", "output.1", "warning", 0.99, 2e-3),
        row(3, "Torch.mul.0.backward", "input.0", "pass", "N/A", "N/A"),  # no output rows: inputs count
        row(4, "Torch.mul.0.backward", "input.1", "pass", 1.0, "1%"),
    ]
    calls, counts = summarize_rows(HEADER, rows)
    assert counts == {"fail": 1, "pass": 3, "warning": 1}
    add, mul = calls
    assert (add["api"], add["status"], add["first_row"]) == ("Torch.add.0.forward", "fail", 0)
    assert add["backward"] is False
    assert add["max_rel_err"] == 2e-3 and add["one_minus_cos"] == pytest.approx(0.01)
    assert (mul["backward"], mul["max_rel_err"], mul["one_minus_cos"]) == (True, 0.01, 0.0)


def test_statistics_mode_has_no_cosine() -> None:
    header = ["NPU Name", "Bench Name", "MaxRelativeErr"]
    rows = [(0, "A.0.forward", "pass", "A.0.forward.output.0", '["a","a","50.0%"]')]
    calls, _ = summarize_rows(header, rows)
    assert calls[0]["max_rel_err"] == 0.5 and calls[0]["one_minus_cos"] is None


def test_first_divergence_prefers_the_localization() -> None:
    suspects = [{"api": "B", "position": 1, "compare_rank": 1},
                {"api": "A", "position": 2, "compare_rank": 0}]  # fmt: skip
    assert first_divergence({"top_suspects": suspects}, 0) == "A"
    first = {"api": "Z", "position": 1, "compare_rank": 0}
    assert first_divergence({"top_suspects": suspects, "first_divergence": first}, 0) == "Z"
    # ``position`` is the suspect's place, never a process rank: rank 1's first divergence is not rank 0's.
    assert first_divergence({"top_suspects": suspects, "first_divergence": first}, 1) == "B"
    assert first_divergence(None, 0) is None


def test_the_throttle_slows_then_blocks_one_address_for_its_window() -> None:
    now = [1000.0]
    throttle = GuessThrottle(limit=5, window_s=60, delay_s=0.5, clock=lambda: now[0])
    delays = [throttle.failed("10.0.0.1", "REST") for _ in range(5)]
    assert delays == [0, 0, 0, 0.5, 1.0]  # a typo or three cost nothing, then each one more
    with pytest.raises(TooManyRequests) as info:
        throttle.check("10.0.0.1")
    assert info.value.retry_after == 60 and info.value.status_code == 429
    throttle.check("10.0.0.2")  # another address is not held back
    now[0] += 30
    with pytest.raises(TooManyRequests) as info:
        throttle.check("10.0.0.1")
    assert info.value.retry_after == 30
    now[0] += 30.5  # the oldest failures left the window
    throttle.check("10.0.0.1")


def test_tokens_match_as_bytes_and_are_fingerprinted_with_the_key() -> None:
    entries = parse_token_entries("a" * 32 + ":rw:alice, " + "b" * 32 + ":ro")
    registry = TokenRegistry(entries, b"k" * 32)
    alice, viewer = registry.tokens
    assert registry.match(b"a" * 32) is alice and registry.match(b"b" * 32) is viewer
    for wrong in (b"", "sécret".encode(), b"\xff" * 32, b"a" * 33, b"a" * 100_000):
        assert registry.match(wrong) is None
    assert alice.identity == "alice" and viewer.identity == f"token {viewer.key[:12]}"
    assert TokenRegistry(entries, b"x" * 32).tokens[1].key != viewer.key  # keyed: another server, another
    assert registry.by_key(viewer.key) is viewer and registry.by_key("0" * 64) is None
    with pytest.raises(ValueError, match="entry 1: name"):
        parse_token_entries("abc:rw:bad name")


def test_environment_diff_lists_settings_and_packages_apart() -> None:
    target = {"torch_version": "2.13", "hostname": "a", "argv": ["x"], "packages": {"numpy": "2", "new": "1"},
              "env": {"NCCL_ALGO": "ring"}}  # fmt: skip
    bench = {"torch_version": "2.12", "hostname": "a", "argv": ["y"], "packages": {"numpy": "2"}}
    diff = environment_diff(target, bench)
    assert [(c.key, c.target, c.bench) for c in diff.changed] == [
        ("env.NCCL_ALGO", "ring", None), ("torch_version", "2.13", "2.12")]  # fmt: skip
    assert [(c.key, c.target, c.bench) for c in diff.packages_changed] == [("new", "1", None)]
    assert diff.same == 2  # hostname and numpy; argv is never compared


def test_sign_in_redirects_stay_on_this_site() -> None:
    assert _safe_next("/runs/abc?x=1") == "/runs/abc?x=1"
    for target in ("//evil.example/", "https://evil.example/", "/\\evil.example", "javascript:alert(1)"):
        assert _safe_next(target) == "/"


def test_urls_keep_filters_and_drop_empty_ones() -> None:
    params = {"project": "llama", "name": "", "tag": "hw=npu", "page": 2}
    assert query_url("/", params, page=3) == "/?project=llama&tag=hw%3Dnpu&page=3"
    assert query_url("/", {}, name="a&b") == "/?name=a%26b"


def test_tags_text() -> None:
    assert _parse_tags("hw= npu, dtype=bf16,") == {"hw": "npu", "dtype": "bf16"}
    with pytest.raises(BadRequest, match="'oops' is not KEY=VALUE"):
        _parse_tags("oops")


def test_decimation_keeps_spikes_order_and_the_divergence() -> None:
    from parity.server.services.calls import decimate

    calls = [{"seq": i, "api": f"A.{i}", "max_rel_err": 1e-6, "one_minus_cos": 1e-9} for i in range(10_000)]
    calls[4321]["max_rel_err"] = 5.0
    calls[777]["one_minus_cos"] = 0.5
    kept = decimate(calls, 400, keep="A.9999")
    seqs = [c["seq"] for c in kept]
    assert len(kept) <= 401 + 1 and seqs == sorted(seqs)
    assert {4321, 777, 9999} <= set(seqs)
    assert decimate(calls[:10], 400) == calls[:10]


def test_the_page_puts_the_columns_that_matter_first() -> None:
    from parity.server.web.columns import page_order
    from parity.shared.compare.headers import CompareMode, full_header

    expected = {
        CompareMode.TENSOR: ["NPU Name", "Parity Status", "Cosine", "MaxRelativeErr"],
        CompareMode.STATISTICS: ["NPU Name", "Parity Status", "MaxRelativeErr", "NormRelativeErr"],
        CompareMode.MD5: ["NPU Name", "Parity Status", "NPU MD5", "BENCH MD5"],
    }
    for mode, first in expected.items():
        header = full_header(mode, stack=True)
        order = page_order(header)
        assert sorted(order) == list(range(len(header)))  # every column, once
        assert [header[i] for i in order[:4]] == first
