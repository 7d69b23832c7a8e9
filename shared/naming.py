"""The one rule for run names, project names and tags, shared by every path that creates a run.

The training client (``PrecisionDebugger``), ``parity upload`` and ``POST /api/v1/runs`` all apply it, so a
name refused by one is refused by all, with the same words, before anything is written. A name is read back
in URL paths (``/runs/{name}``, ``/projects/{project}/...``), log lines and file names, so:

- surrounding spaces are trimmed (``"  nightly 4 "`` is ``"nightly 4"``): a name typed with a stray space
  would otherwise never match what the user types next;
- a ``/`` is refused: routers split paths at it, so ``DELETE /runs/a%2Fb`` could never reach the run;
- ``.`` and ``..`` are refused: URL normalisation removes them from a path before any route sees it;
- control characters (newlines, escapes) are refused: they would forge log lines or garble a terminal;
- a name is NFKC-normalised (fullwidth ``ｎｉｇｈｔｌｙ`` is ``nightly``), and format characters (zero-width
  space, byte-order mark, right-to-left override and the other bidi controls) are refused: each makes a
  name that looks like another and is not;
- two names of a project whose :func:`skeleton` is the same (``nightly`` and ``nіghtly`` with a Cyrillic
  ``і``) are one name to the server: the second is refused as a duplicate of the first.

Tags are ``KEY=VALUE`` on the command line and in the REST filter (``?tag=KEY=VALUE``, split at the first
``=`` and trimmed), so a key holding ``=`` or either side with surrounding spaces could never be asked for:
keys are refused with ``=``, both sides are trimmed.

Each check raises :class:`NameRefused` (a ``ValueError``, so a pydantic validator turns it into a 422 naming
the field; a ``ParityError``, so the command line prints it as one line).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping

from parity.shared.errors import ParityError

__all__ = [
    "MAX_NAME_LENGTH",
    "MAX_TAGS",
    "MAX_TAG_KEY_LENGTH",
    "MAX_TAG_VALUE_LENGTH",
    "NameRefused",
    "check_name",
    "check_tags",
    "skeleton",
]

#: Longest run or project name (the database column's width).
MAX_NAME_LENGTH = 255
#: Longest tag key and tag value (the database columns' widths).
MAX_TAG_KEY_LENGTH = 255
MAX_TAG_VALUE_LENGTH = 1024
#: Most tags on one run: tags are filters, not a place for metadata (``metadata`` takes free JSON).
MAX_TAGS = 64

#: C0 and C1 control characters, DEL, and the Unicode line and paragraph separators.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


#: Cyrillic, Greek and other letters drawn as a Latin one (the common part of Unicode's confusables.txt
#: for names typed in Latin script): a name's skeleton spells them in Latin.
_LOOKALIKES = str.maketrans(
    "АВЕЅІЈКМНОРСТХУаеһіјорсхуѕԁԛԝӏɡΑΒΕΖΗΙΚΜΝΟΡΤΥΧαοτνιρ",
    "ABESIJKMHOPCTXYaehijopcxysdqwlgABEZHIKMNOPTYXaotvip",
)


def skeleton(name: str) -> str:
    """What ``name`` looks like: NFKC-normalised, look-alike letters spelled in Latin; two names with the
    same skeleton are one name to a reader (and so to the duplicate check)."""
    return unicodedata.normalize("NFKC", name).translate(_LOOKALIKES)


class NameRefused(ParityError, ValueError):
    """A run name, project name or tag that no route could address: ``field`` names it, ``problem`` says
    why (a pydantic validator raises the problem alone: its error already names the field)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def _one_line(text: str, field: str, what: str = "") -> None:
    bad = _CONTROL.search(text)
    if bad is not None:
        raise NameRefused(
            field, f"{what}holds the control character U+{ord(bad.group()):04X} at position {bad.start()}; "
            "names and tags are one line of printable text",
        )  # fmt: skip


def check_name(value: object, field: str = "name") -> str:
    """``value`` trimmed and NFKC-normalised, when it is a name a route can address; else
    :class:`NameRefused` for ``field``."""
    if not isinstance(value, str):
        raise NameRefused(field, f"must be a string, got {type(value).__name__}")
    _one_line(value, field)  # before trimming: a stray newline is a mistake to show, not to hide
    for i, char in enumerate(value):
        if unicodedata.category(char) == "Cf":
            what = unicodedata.name(char, "unnamed")
            raise NameRefused(field, f"holds the invisible format character U+{ord(char):04X} ({what}) at "
                              f"position {i}; a name is what it shows")  # fmt: skip
    name = unicodedata.normalize("NFKC", value).strip()
    if not name:
        raise NameRefused(field, "must not be empty (or only spaces)")
    if len(name) > MAX_NAME_LENGTH:
        raise NameRefused(field, f"{len(name)} characters, at most {MAX_NAME_LENGTH} are allowed")
    if "/" in name:
        raise NameRefused(field, f"{name!r} holds a '/', which no URL path can address; use '-' or '_'")
    if name in (".", ".."):
        raise NameRefused(field, f"{name!r} is removed from URL paths; choose another name")
    return name


def check_tags(tags: Mapping[object, object], field: str = "tags") -> dict[str, str]:
    """The tags with keys and values trimmed, within the limits; else :class:`NameRefused` naming the tag."""
    if len(tags) > MAX_TAGS:
        raise NameRefused(field, f"{len(tags)} tags, at most {MAX_TAGS} allowed (the rest fit in metadata)")
    out: dict[str, str] = {}
    for raw_key, raw_value in tags.items():
        if not isinstance(raw_key, str) or not isinstance(raw_value, str):
            raise NameRefused(field, f"tag {raw_key!r}: keys and values must be strings")
        key, value = raw_key.strip(), raw_value.strip()
        tag = f"tag {key[:40]!r}{'...' if len(key) > 40 else ''}: "
        _one_line(raw_key, field, tag)
        _one_line(raw_value, field, tag)
        if not key:
            raise NameRefused(field, "a tag key must not be empty (or only spaces)")
        if len(key) > MAX_TAG_KEY_LENGTH:
            raise NameRefused(field, f"{tag}the key has {len(key)} characters, at most {MAX_TAG_KEY_LENGTH}")
        if "=" in key:
            raise NameRefused(field, f"{tag}a key holds no '=' (tags read KEY=VALUE, split at the first '=')")
        if len(value) > MAX_TAG_VALUE_LENGTH:
            raise NameRefused(field, f"{tag}the value has {len(value)} characters, at most "
                                     f"{MAX_TAG_VALUE_LENGTH}")  # fmt: skip
        if key in out:
            raise NameRefused(field, f"{tag}given twice once trimmed")
        out[key] = value
    return out
