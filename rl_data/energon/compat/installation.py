"""The explicit install of rl_data's Energon compatibility: the version check.

rl_data's fixes and worker additions (:mod:`rl_data.energon.compat.loader`) and its reads of
Energon's private fields (:mod:`rl_data.energon.compat.internals`) were checked against the
Megatron-Energon versions of :data:`SUPPORTED_ENERGON` only. :func:`install` checks the installed
version once per process; ``build_energon_sft_loader`` calls it before it builds anything, and
:class:`~rl_data.energon.compat.loader.SavableLoader` refuses to be built before it. Importing
rl_data changes nothing in Energon: every fix lives in rl_data's own subclasses.
"""

from __future__ import annotations

import megatron.energon
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

#: The Megatron-Energon versions rl_data supports (pyproject's pin: tests/test_energon_compat.py).
SUPPORTED_ENERGON = ">=7.4,<7.5"

_installed: str | None = None


def check_version(found: str) -> None:
    """Raise unless Megatron-Energon version ``found`` is in :data:`SUPPORTED_ENERGON`."""
    try:
        supported = Version(found) in SpecifierSet(SUPPORTED_ENERGON)
    except InvalidVersion:
        supported = False
    if not supported:
        raise RuntimeError(
            f"rl_data needs megatron-energon{SUPPORTED_ENERGON}, found {found!r}: rl_data.energon.compat "
            "fixes and reads Energon internals checked against that range only. Install a supported "
            f"version (pip install 'megatron-energon{SUPPORTED_ENERGON}'), or re-check "
            "rl_data/energon/compat against the new version (tests/test_energon_compat.py and the "
            "energon tests) and widen SUPPORTED_ENERGON and pyproject's pin together"
        )


def install() -> None:
    """Check the installed Megatron-Energon version (see :func:`check_version`); idempotent."""
    global _installed
    found = _energon_version()
    if _installed != found:
        check_version(found)
        _installed = found


def installed() -> bool:
    """Whether :func:`install` succeeded in this process."""
    return _installed is not None


def _energon_version() -> str:
    return megatron.energon.__version__
