"""Objects named by import path, ``"package.module:ATTRIBUTE"`` (tasks, adapters, processor factories)."""

from __future__ import annotations

import importlib
from typing import Any


def load_object(path: str, what: str, *, hint: str = "") -> Any:
    """The attribute ``path`` names; a ``ValueError`` says which ``what`` could not be imported and
    why (``hint``: how to fix it, appended after ``; ``)."""
    module_name, _, attribute = str(path).partition(":")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"cannot import {what} {path!r}: {error}" + (f"; {hint}" if hint else "")) from error
