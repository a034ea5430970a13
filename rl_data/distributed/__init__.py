"""Distributed runtime: rank actors per logical DP rank (a rank pool), coordinator, checkpoints, transfer.

Importing it does not import torch (the coordinator process starts faster without it); the
torch-based ``batch_to_device`` and ``fetch_batch`` load on first use.
"""

from rl_data._moved import moved_names as _moved_names

# Former re-exports (see rl_data/_moved.py).
__getattr__ = _moved_names(
    __name__,
    {
        "CheckpointFileError": "rl_data",
        "CoordinatorClient": "rl_data",
        "CoordinatorNotFoundError": "rl_data",
        "DataCoordinator": "rl_data.distributed.coordinator",
        "DataExhaustedError": "rl_data",
        "LoaderSpec": "rl_data",
        "ParallelLayout": "rl_data",
        "RankActor": "rl_data.distributed.rank_actor",
        "RankFailedError": "rl_data",
        "RankPlacement": "rl_data.distributed.placement",
        "RankPool": "rl_data.distributed.rank_pool",
        "RankTimeoutError": "rl_data",
        "RestoreIncompleteError": "rl_data",
        "RuntimeConfig": "rl_data",
        "StepPrefetcher": "rl_data",
        "adopt_placement_group": "rl_data.distributed.placement",
        "attach": "rl_data",
        "batch_to_device": "rl_data",
        "checkpoint_path": "rl_data.distributed.checkpoint_files",
        "create_rank_placement": "rl_data.distributed.placement",
        "fetch_batch": "rl_data",
        "get_coordinator": "rl_data",
        "load_checkpoint_file": "rl_data.distributed.checkpoint_files",
        "placement_fingerprint": "rl_data.distributed.placement",
        "placement_layout": "rl_data.distributed.placement",
        "save_checkpoint_file": "rl_data.distributed.checkpoint_files",
        "start_data_coordinator": "rl_data",
        "wait_until_name_is_free": "rl_data.distributed.client",
    },
)
