"""Ray Data preprocessing: raw conversation files (JSONL / JSON / Parquet, several schemas) ->
validated canonical samples -> an Energon WebDataset dataset, with rejected rows quarantined."""

from rl_data.preprocess.adapters import ADAPTERS, detect_adapter, register_adapter, resolve_adapter
from rl_data.preprocess.pipeline import PreprocessConfig, PreprocessSummary, connect_ray, run_preprocess
from rl_data.preprocess.validation import REASONS, RowRejected

__all__ = [
    "ADAPTERS",
    "REASONS",
    "PreprocessConfig",
    "PreprocessSummary",
    "RowRejected",
    "connect_ray",
    "detect_adapter",
    "register_adapter",
    "resolve_adapter",
    "run_preprocess",
]
