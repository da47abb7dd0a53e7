"""A griffe extension for the API reference: docstrings as the reader should see them.

* `FiberExecutor`'s docstring lists its arguments from the settings table when its module is
  imported, so its source holds an ``{arguments}`` placeholder. For a class whose docstring in
  the source holds such a placeholder, the reference shows the docstring of the imported class.
* The docstrings follow the Google style, which spells a section ``Example:`` or
  ``Examples:``; griffe reads only the second as doctest examples, so the first is read as it.
* A paragraph ending in ``::`` (a reStructuredText literal block) ends in ``:`` in Markdown.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import griffe

PLACEHOLDER = re.compile(r"\{[a-z_]+\}")
EXAMPLE_SECTION = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)
LITERAL_MARKER = re.compile(r"(\S)::$", re.MULTILINE)


class RuntimeDocstrings(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is None:
            return
        text = docstring.value
        if obj.is_class and PLACEHOLDER.search(text):
            text = inspect.cleandoc(griffe.dynamic_import(obj.path).__doc__ or "")
        text = EXAMPLE_SECTION.sub(r"\1Examples:", text)
        docstring.value = LITERAL_MARKER.sub(r"\1:", text)
