"""The API reference is generated from the docstrings: every parameter of every public function
and class is described in its ``Args:`` section, and the string options are ``Literal`` types
naming their choices (what IDEs and type checkers show)."""

from __future__ import annotations

import inspect
import re
import typing

import pytest
import tokshuf
import tokshuf.grain

PUBLIC = [
    tokshuf.build_cache,
    tokshuf.Cache,
    tokshuf.Reader,
    tokshuf.Blend,
    tokshuf.verify,
    tokshuf.document_boundaries,
    tokshuf.shift_targets,
    tokshuf.grain.DataSource,
    tokshuf.grain.map_dataset,
]


def described(obj) -> set:
    doc = inspect.getdoc(obj) or ""
    section = re.search(r"^Args:\n(.*?)(?:^\S|\Z)", doc, re.M | re.S)
    return set(re.findall(r"^    (\*{0,2}\w+):", section[1], re.M)) if section else set()


@pytest.mark.parametrize("obj", PUBLIC, ids=lambda o: o.__qualname__)
def test_every_parameter_is_described(obj):
    params = inspect.signature(obj).parameters
    want = {("**" if p.kind is p.VAR_KEYWORD else "") + name for name, p in params.items() if name != "self"}
    assert want - described(obj) == set(), f"{obj.__qualname__}: parameters without a description"


def test_string_options_are_literals():
    hints = typing.get_type_hints(tokshuf.build_cache)
    for name in ("format", "tail", "errors", "tokenizer_backend", "packing", "engine"):
        choices = typing.get_args(hints[name])
        assert typing.get_origin(hints[name]) is typing.Literal and choices, name
        default = inspect.signature(tokshuf.build_cache).parameters[name].default
        assert default in choices, (name, default, choices)
    reader = typing.get_type_hints(tokshuf.Reader.__init__)
    assert "segment_ids" in str(reader["boundaries"]) and "int64" in str(reader["dtype"])
