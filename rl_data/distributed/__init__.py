"""Distributed runtime: rank actors per logical DP rank, coordinator, checkpoints, transfer."""

from rl_data.distributed.checkpoint_files import (
    CheckpointFileError,
    checkpoint_path,
    load_checkpoint_file,
    save_checkpoint_file,
)
from rl_data.distributed.client import CoordinatorClient, CoordinatorNotFoundError, attach, get_coordinator
from rl_data.distributed.config import LoaderSpec, ParallelLayout, RuntimeConfig
from rl_data.distributed.coordinator import (
    DataCoordinator,
    RankFailedError,
    RankTimeoutError,
    start_data_coordinator,
)
from rl_data.distributed.placement import (
    RankPlacement,
    adopt_placement_group,
    create_rank_placement,
    placement_fingerprint,
    placement_layout,
)
from rl_data.distributed.rank_actor import DataExhaustedError, RankActor
from rl_data.distributed.transfer import batch_to_device, fetch_batch

__all__ = [
    "CheckpointFileError",
    "CoordinatorClient",
    "CoordinatorNotFoundError",
    "DataCoordinator",
    "DataExhaustedError",
    "LoaderSpec",
    "ParallelLayout",
    "RankActor",
    "RankFailedError",
    "RankPlacement",
    "RankTimeoutError",
    "RuntimeConfig",
    "adopt_placement_group",
    "attach",
    "batch_to_device",
    "checkpoint_path",
    "create_rank_placement",
    "fetch_batch",
    "get_coordinator",
    "load_checkpoint_file",
    "placement_fingerprint",
    "placement_layout",
    "save_checkpoint_file",
    "start_data_coordinator",
]
