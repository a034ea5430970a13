"""Megatron-Energon compatibility, in one place.

* :func:`install` (:mod:`.installation`): the explicit, idempotent install: checks the installed
  Energon version against :data:`SUPPORTED_ENERGON` (``build_energon_sft_loader`` calls it).
* :class:`SavableLoader` (:mod:`.loader`): Energon's savable loader with rl_data's fixes and worker
  additions, each one method of rl_data's own subclasses: no Energon class is patched.
* :mod:`.internals`: the only module that reads or writes Energon's private fields.
"""

from rl_data.energon.compat.installation import SUPPORTED_ENERGON, check_version, install, installed
from rl_data.energon.compat.loader import SavableDatasetWrapper, SavableLoader, WatchdogDataset

__all__ = [
    "SUPPORTED_ENERGON",
    "SavableDatasetWrapper",
    "SavableLoader",
    "WatchdogDataset",
    "check_version",
    "install",
    "installed",
]
