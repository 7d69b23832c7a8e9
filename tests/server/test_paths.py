"""Upload path and header checks, without a server."""

from __future__ import annotations

import pytest
from parity.server.errors import BadRequest
from parity.server.services.paths import check_sha256, check_upload_path


@pytest.mark.parametrize(
    ("path", "expected"),
    [("step0/rank0/dump.json", (0, 0)), ("step12/rank3/dump_tensor_data/a.b.pt", (12, 3)),
     ("step1/rank/dump.json", (None, None)), ("notes.txt", (None, None))],
)  # fmt: skip
def test_good_paths(path: str, expected: tuple[int | None, int | None]) -> None:
    assert check_upload_path(path) == expected


@pytest.mark.parametrize(
    ("path", "problem"),
    [("", "empty"), ("/etc/passwd", "absolute"), ("a/../b", "'..'"), ("..", "'..'"), ("a/./b", "'.'"),
     ("a\\b", "backslash"), ("a\x00b", "NUL"), ("a//b", "empty segment"), ("a/", "empty segment"),
     ("c:/x", "drive"), ("a\nb", "control"), ("x" * 1025, "longer")],
)  # fmt: skip
def test_bad_paths_name_the_problem(path: str, problem: str) -> None:
    with pytest.raises(BadRequest, match=problem) as info:
        check_upload_path(path)
    assert info.value.status_code == 400


def test_sha256_header() -> None:
    assert check_sha256("AB" * 32) == "ab" * 32
    for bad in (None, "", "ab" * 31, "zz" * 32):
        with pytest.raises(BadRequest, match="X-Content-SHA256"):
            check_sha256(bad)
