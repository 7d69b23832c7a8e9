"""The one rule for run names, project names and tags (``parity.shared.naming``)."""

from __future__ import annotations

import pytest
from parity.shared.errors import ParityError
from parity.shared.naming import MAX_NAME_LENGTH, MAX_TAGS, NameRefused, check_name, check_tags


def test_names_are_trimmed() -> None:
    assert check_name("  nightly 4 ", "run_name") == "nightly 4"
    assert check_name("a.b-c_d:e (f)") == "a.b-c_d:e (f)"


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("  nightly 4 / x  ", "holds a '/'"),
        ("a\nb", "control character U+000A"),
        ("a\x1b[31m", "control character U+001B"),
        ("a\u2028b", "control character U+2028"),
        ("..", "removed from URL paths"),
        (".", "removed from URL paths"),
        ("   ", "must not be empty"),
        ("x" * (MAX_NAME_LENGTH + 1), f"at most {MAX_NAME_LENGTH}"),
        (3, "must be a string"),
    ],
)
def test_names_no_route_could_address_are_refused(name: object, words: str) -> None:
    with pytest.raises(NameRefused) as info:
        check_name(name, "run_name")
    assert str(info.value).startswith("run_name: ") and words in str(info.value)
    assert isinstance(info.value, ParityError) and isinstance(info.value, ValueError)


def test_tags_are_trimmed_and_limited() -> None:
    assert check_tags({" hw ": " gpu ", "lr": "1e-3=x"}) == {"hw": "gpu", "lr": "1e-3=x"}
    assert check_tags({f"k{i}": "v" for i in range(MAX_TAGS)})
    with pytest.raises(NameRefused, match=f"at most {MAX_TAGS} allowed"):
        check_tags({f"k{i}": "v" for i in range(MAX_TAGS + 1)})


@pytest.mark.parametrize(
    ("tags", "words"),
    [
        ({"note": "x" * 2000}, "tag 'note': the value has 2000 characters, at most 1024"),
        ({"k" * 300: "v"}, "the key has 300 characters, at most 255"),
        ({"a=b": "v"}, "tag 'a=b': a key holds no '='"),
        ({"  ": "v"}, "a tag key must not be empty"),
        ({"k": "v\r"}, "tag 'k': holds the control character U+000D"),
        ({"k": "v", " k": "w"}, "given twice once trimmed"),
        ({"k": 1}, "keys and values must be strings"),
    ],
)
def test_bad_tags_are_refused_naming_the_tag(tags: dict, words: str) -> None:
    with pytest.raises(NameRefused) as info:
        check_tags(tags)
    assert str(info.value).startswith("tags: ") and words in str(info.value)
