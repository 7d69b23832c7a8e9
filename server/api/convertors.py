"""The path convertor of run references: ``{run_id:ref}`` takes any text, ``/`` and line breaks included.

A run is addressed by its name wherever by its id, and a name URL-escaped in a path arrives decoded: a name
holding a ``/`` (``%2F``, from before names were checked) spans two segments, which ``{run_id}`` refuses,
and Starlette's own ``path`` convertor (``.*``) stops at a line break, so a forged name would be a 404 before
the service sees it. Routes that take a run and more path after it (``/runs/{run_id}/files``) are declared
before those that end in ``{run_id:ref}``, so they match first.
"""

from __future__ import annotations

from starlette.convertors import Convertor, register_url_convertor


class RunRefConvertor(Convertor[str]):
    regex = r"[\s\S]+"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("ref", RunRefConvertor())
