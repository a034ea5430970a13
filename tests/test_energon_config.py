"""Config blocks of the Energon loader: defaults, range checks, unknown keys, error wording."""

from __future__ import annotations

import pytest

from rl_data.energon.config import EnergonLoaderConfig, EnergonSourceConfig
from rl_data.energon.sft_dataloader import _loader_config, _source_config

_LOADER_FIELDS = (
    "num_workers, shuffle_buffer_size, max_samples_per_sequence, packing_buffer_size, "
    "seed_offset, prefetch_factor, checkpoint_every_sec, watchdog_timeout_seconds, task, "
    "cooker, max_consecutive_failures, max_failure_ratio, failure_ratio_min_samples"
)


def test_source_defaults_and_values():
    source = _source_config({"path": "/data/chat", "split": "train"}, name="energon.train")
    assert source == EnergonSourceConfig(path="/data/chat", split="train")
    assert source.model_dump() == {
        "path": "/data/chat",
        "mixture": None,
        "split": "train",
        "virtual_epoch_length": 0,
        "limit": None,
        "epoch_mode": "exact",
    }


def test_source_config_instance_is_returned_as_is():
    source = EnergonSourceConfig(path="/d", split="val", limit=3)
    assert _source_config(source, name="energon.validation") is source


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            {"path": "/d", "split": "train", "virtual_epoch_length": -1},
            "invalid energon.train (EnergonSourceConfig): virtual_epoch_length=-1: "
            "Input should be greater than or equal to 0",
        ),
        (
            {"path": "/d", "split": "train", "limit": 0},
            "invalid energon.train (EnergonSourceConfig): limit=0: "
            "Input should be greater than or equal to 1",
        ),
        (
            {"path": "/d"},
            "invalid energon.train (EnergonSourceConfig): split: Field required",
        ),
        (
            {"path": "/d", "split": "train", "shards": 3},
            "invalid energon.train (EnergonSourceConfig): shards=3: Extra inputs are not permitted",
        ),
        (
            {"path": "", "split": "train"},
            "invalid energon.train (EnergonSourceConfig): path='': "
            "String should have at least 1 character",
        ),
    ],
)
def test_invalid_source_names_block_field_and_rule(value, message):
    with pytest.raises(ValueError) as error:
        _source_config(value, name="energon.train")
    assert (
        str(error.value) == message + " (allowed fields: path, mixture, split, virtual_epoch_length, limit, epoch_mode)"
    )


def test_source_that_is_not_a_mapping():
    with pytest.raises(ValueError) as error:
        _source_config("/data/chat", name="energon.train")
    assert str(error.value) == (
        "energon.train must be a mapping of EnergonSourceConfig fields "
        "(path, mixture, split, virtual_epoch_length, limit, epoch_mode), got str: '/data/chat'"
    )


def test_loader_defaults():
    assert _loader_config({}) == EnergonLoaderConfig()
    assert EnergonLoaderConfig().model_dump() == {
        "num_workers": 0,
        "shuffle_buffer_size": 100,
        "max_samples_per_sequence": 100,
        "packing_buffer_size": None,
        "seed_offset": 0,
        "prefetch_factor": 2,
        "checkpoint_every_sec": 0.0,
        "watchdog_timeout_seconds": 60.0,
        "task": "chat_sft",
        "cooker": None,
        "max_consecutive_failures": 100,
        "max_failure_ratio": 0.1,
        "failure_ratio_min_samples": 100,
    }


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ({"num_workers": -1}, "num_workers=-1: Input should be greater than or equal to 0"),
        (
            {"shuffle_buffer_size": 0},
            "shuffle_buffer_size=0: Input should be greater than or equal to 1",
        ),
        ({"prefetch_factor": 0}, "prefetch_factor=0: Input should be greater than or equal to 1"),
        ({"checkpoint_every_sec": -1}, "checkpoint_every_sec=-1: Input should be greater than or equal to 0"),
        (
            {"max_failure_ratio": 1.5},
            "max_failure_ratio=1.5: Input should be less than or equal to 1",
        ),
        (
            {"num_workers": "two"},
            "num_workers='two': Input should be a valid integer, unable to parse string as an integer",
        ),
        ({"shuffle": True}, "shuffle=True: Extra inputs are not permitted"),
    ],
)
def test_invalid_loader_names_field_and_rule(value, detail):
    with pytest.raises(ValueError) as error:
        _loader_config(value)
    assert str(error.value) == (
        f"invalid data_config['energon'] (EnergonLoaderConfig): {detail} (allowed fields: {_LOADER_FIELDS})"
    )


def test_identity_dump_leaves_out_runtime_only_fields():
    config = EnergonLoaderConfig(num_workers=2, prefetch_factor=4, watchdog_timeout_seconds=None)
    assert config.identity_dump() == {
        "num_workers": 2,
        "shuffle_buffer_size": 100,
        "max_samples_per_sequence": 100,
        "packing_buffer_size": None,
        "seed_offset": 0,
        "task_encoder": "chat_sft",
        "cooker": None,
    }


def test_configs_are_frozen():
    with pytest.raises(ValueError):
        EnergonLoaderConfig().num_workers = 3
