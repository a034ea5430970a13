"""rl_data: a Ray-based, checkpointable data pipeline for LLM post-training."""

__version__ = "0.1.0"
