"""Sphinx configuration of the rl_data documentation site (Sphinx + MyST, the furo theme).

Build: ``bash scripts/docs.sh`` (warnings are errors); serve while editing: ``bash scripts/docs.sh serve``.
The pages under ``reference/`` are written by ``docs/generate.py``, never by hand.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from docutils import nodes
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

import rl_data

project = "rl_data"
author = "rl_data contributors"
copyright = "rl_data contributors"
release = version = rl_data.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_copybutton",
]
source_suffix = {".md": "markdown"}
root_doc = "index"
# metrics_table.md is a fragment: included by reference/metrics.md and the monitoring guide.
exclude_patterns = ["_build", "reference/metrics_table.md"]

# MyST: ::: fences, definition lists, `{.class}` lines before a block, and an anchor for every
# heading down to ####, so that [text](page.md#a-section) links resolve (a broken one fails the build).
myst_enable_extensions = ["attrs_block", "colon_fence", "deflist"]
myst_heading_anchors = 4

# autodoc: signatures keep their types, wrapped one parameter a line when long; members in
# source order; type names without their module paths.
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"
autodoc_class_signature = "mixed"
autodoc_default_options = {"exclude-members": "model_config, model_fields, model_computed_fields"}
# The "on this page" lists show the sections, not every class, function and method.
toc_object_entries = False
# `--flag` stays two hyphens, quotes stay straight (command lines and code in prose).
smartquotes = False
python_use_unqualified_type_names = True
python_maximum_signature_line_length = 88
add_module_names = False

html_theme = "furo"
html_title = f"rl_data {release}"
html_static_path = ["_static"]
html_css_files = ["rl_data.css"]
html_show_sourcelink = False
copybutton_prompt_text = r"\$ "
copybutton_prompt_is_regexp = True

# Importing the public modules documents them; their deprecation notices are not build warnings.
warnings.filterwarnings("ignore", category=FutureWarning)


def _stability_of(name: str) -> str | None:
    """The stability of a public name documented as ``name`` (``rl_data.X`` or ``<public module>.X``)."""
    module, _, attribute = name.rpartition(".")
    if module == "rl_data" and attribute in rl_data._PUBLIC:
        return rl_data._PUBLIC[attribute][1]
    return rl_data._PUBLIC_MODULES.get(module)


def _stability_badge(_app: Any, what: str, name: str, obj: Any, _options: Any, lines: list[str]) -> None:
    """Put the stability badge of a public name at the top of its documentation; a type alias
    without a ``#:`` comment shows no docstring (autodoc would show the aliased type's)."""
    if what == "module":
        return
    if what == "data" and "\n".join(lines).strip() == (inspect.getdoc(obj) or "").strip():
        lines.clear()
    stability = _stability_of(name)
    if stability is not None:
        lines[:0] = [f":stability:`{stability}`", ""]


def _stability_role(_name: str, rawtext: str, text: str, *_args: Any, **_kwargs: Any) -> tuple[list[Any], list[Any]]:
    """``{stability}`beta``: the label as a badge (styled by _static/rl_data.css)."""
    if text not in ("stable", "beta"):
        raise ValueError(f"stability role: {text!r} is not a stability; expected 'stable' or 'beta'")
    return [nodes.inline(rawtext, text, classes=["stability", f"stability-{text}"])], []


def _model_signature(
    _app: Any, what: str, _name: str, obj: Any, _options: Any, signature: str | None, annotation: str | None
) -> tuple[str | None, str | None] | None:
    """A pydantic model's signature as its field names and defaults (types and bounds: configs.md)."""
    if what != "class" or not (inspect.isclass(obj) and issubclass(obj, BaseModel)):
        return None
    fields = []
    for name, field in obj.model_fields.items():
        if field.default_factory is not None:
            fields.append(f"{name}={field.default_factory()!r}")
        elif field.default is PydanticUndefined:
            fields.append(name)
        else:
            fields.append(f"{name}={field.default!r}")
    return "(*, " + ", ".join(fields) + ")", annotation


def setup(app: Any) -> None:
    app.add_role("stability", _stability_role)
    app.connect("autodoc-process-docstring", _stability_badge)
    app.connect("autodoc-process-signature", _model_signature)
