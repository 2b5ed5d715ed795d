"""Griffe extension for the docs site (mkdocs.yml): the docstrings' Sphinx roles
(:class:`tokshuf.Cache`, :meth:`seek`, ...), which ``help()`` shows as they are, render as code
on the site instead of as raw text."""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension, Object

ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj):`~?([^`]+)`")


class SphinxRolesAsCode(Extension):
    def on_object(self, *, obj: Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(r"`\1`", obj.docstring.value)
