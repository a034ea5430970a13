"""Names a package used to re-export, importable from it for one more release with a ``FutureWarning``."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping

#: The release that removes the former import paths.
REMOVED_IN = "0.3"


def moved_names(package: str, targets: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package``: each name of ``targets`` still resolves (from the
    module ``targets[name]``, ``"rl_data"`` for the public facade), warning where to import it from."""

    def __getattr__(name: str) -> object:
        target = targets.get(name)
        if target is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        warnings.warn(
            f"'from {package} import {name}' is deprecated and stops working in rl_data {REMOVED_IN}: "
            f"use 'from {target} import {name}'",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(target), name)

    return __getattr__
