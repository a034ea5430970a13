"""Ray Data preprocessing: raw conversation files (JSONL / JSON / Parquet, several schemas) ->
validated canonical samples -> an Energon WebDataset dataset, with rejected rows quarantined."""

from rl_data._moved import moved_names as _moved_names

# Former re-exports (see rl_data/_moved.py).
__getattr__ = _moved_names(
    __name__,
    {
        "ADAPTERS": "rl_data.preprocess.adapters",
        "PreprocessConfig": "rl_data",
        "PreprocessSummary": "rl_data",
        "REASONS": "rl_data.preprocess.validation",
        "RowRejected": "rl_data.preprocess.validation",
        "connect_ray": "rl_data.preprocess.pipeline",
        "detect_adapter": "rl_data.preprocess.adapters",
        "register_adapter": "rl_data.preprocess.adapters",
        "resolve_adapter": "rl_data.preprocess.adapters",
        "run_preprocess": "rl_data",
    },
)
