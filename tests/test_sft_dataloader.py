"""EnergonSFTDataLoader on a real Energon dataset with the real tokenizer.

Restore at every step, the state envelope, refusals with exact diff lines, rank partitioning,
validation semantics, argument checks, bad samples and the failure budget.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from energon_fixtures import make_loader, write_chat_dataset
from restore_check import assert_restores_at_every_step, torch_roundtrip
from rl_data.config_blocks import ConfigError
from rl_data.energon.config import EnergonLoaderConfig
from rl_data.energon.failure_budget import SampleFailureBudgetExceeded
from rl_data.fingerprint import fingerprint
from rl_data.energon.sft_dataloader import (
    EnergonSFTDataLoader,
    _worker_config,
    build_energon_sft_loader,
    compact_sample_error_handler,
)

MAX_LEN = 512
PACKING = dict(
    packing_algorithm="first_fit_decreasing",
    max_sequences_per_bin=None,
    sequence_length_pad_multiple=8,
)


def unpacked_view(batch):
    if "message_log" not in batch:  # padded training tensors (batch_format "tensors", the default)
        keys = ("input_ids", "input_lengths", "token_mask", "sample_mask", "loss_multiplier")
        return batch["source_ids"], {k: batch[k] for k in keys}
    logs = batch["message_log"]
    return batch["source_ids"], {
        "tokens": torch.cat([m["token_ids"] for log in logs for m in log]),
        "lengths": torch.tensor([sum(len(m["token_ids"]) for m in log) for log in logs]),
        "loss_multiplier": batch["loss_multiplier"],
    }


def packed_view(batch):
    ids = [i for pack in batch["source_ids"] for i in pack]
    tensors = {k: batch[k] for k in ("input_ids", "input_lengths", "token_mask", "sample_mask")}
    tensors["cu_seqlens"] = torch.cat(batch["cu_seqlens"].tensors)
    tensors["cu_seqlens_padded"] = torch.cat(batch["cu_seqlens_padded"].tensors)
    return ids, tensors


def all_ids(loader, extract=unpacked_view):
    """Every id of one pass (one ``for`` loop) over ``loader``."""
    return [i for batch in loader for i in extract(batch)[0]]


# --------------------------------------------------------------------------- restore


@pytest.mark.timeout(120)
def test_restore_at_every_step_without_packing(energon_dataset, tokenizer):
    report = assert_restores_at_every_step(
        lambda: make_loader(energon_dataset, tokenizer), steps=10, extract=unpacked_view
    )
    assert report.epoch_starts == [4, 8]  # k = 4 and k = 8 restore exactly at epoch boundaries
    ids = report.ids
    assert len(set(ids)) == len(ids) == 40  # no repeats inside the first pass over 192 samples
    assert set(ids) <= set(energon_dataset.split_keys["train"])
    assert ids[:8] != energon_dataset.split_keys["train"][:8]  # shuffled


@pytest.mark.timeout(120)
def test_restore_at_every_step_with_packing(energon_dataset, tokenizer):
    report = assert_restores_at_every_step(
        lambda: make_loader(
            energon_dataset,
            tokenizer,
            energon={"packing_buffer_size": 12},
            source={"virtual_epoch_length": 3},
            batch_size=2,
            **PACKING,
        ),
        steps=7,
        extract=packed_view,
    )
    assert report.epoch_starts == [3, 6]
    assert all(len(step.ids) > 2 for step in report.steps)  # several sources per batch of 2 packs


@pytest.mark.timeout(60)
def test_state_dict_survives_torch_save_and_weights_only_load(energon_dataset, tokenizer):
    loader = make_loader(energon_dataset, tokenizer)
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    assert sorted(state) == [
        "backend",
        "fingerprint",
        "format_version",
        "identity",
        "loader_state",
        "position",
    ]
    assert state["backend"] == "energon" and state["format_version"] == 2
    assert state["position"] == {
        "cursor": 0,
        "finished": [],
        "passes": 0,
        "pass_batches": 1,
        "pass_dropped": 0,
        "loop_batches": 1,
    }
    assert state["identity"] == loader.identity
    assert state["fingerprint"] == fingerprint(loader.identity)
    assert state["loader_state"].dtype == torch.uint8 and state["loader_state"].dim() == 1
    loaded = torch_roundtrip(state)
    assert loaded["identity"] == state["identity"]
    assert torch.equal(loaded["loader_state"], state["loader_state"])
    expected = unpacked_view(next(iterator))[0]
    fresh = make_loader(energon_dataset, tokenizer)
    fresh.load_state_dict(loaded)
    assert unpacked_view(next(iter(fresh)))[0] == expected


@pytest.mark.timeout(60)
def test_state_dict_right_after_iter_with_workers_does_not_hang(energon_dataset, tokenizer):
    energon = {"num_workers": 2}
    loader = make_loader(energon_dataset, tokenizer, energon=energon)
    iterator = iter(loader)
    state = loader.state_dict()
    first = unpacked_view(next(iterator))[0]
    after_first = loader.state_dict()  # live state from the workers
    second = unpacked_view(next(iterator))[0]
    loader.close()
    restored = make_loader(energon_dataset, tokenizer, energon=energon)
    restored.load_state_dict(state)
    assert restored.state_dict()["loader_state"].numel() > 0  # before iter(): no hang either
    batches = iter(restored)
    assert restored.state_dict()["identity"] == state["identity"]
    assert unpacked_view(next(batches))[0] == first
    restored.close()
    resumed = make_loader(energon_dataset, tokenizer, energon=energon)
    resumed.load_state_dict(after_first)
    assert unpacked_view(next(iter(resumed)))[0] == second
    resumed.close()
    with pytest.raises(RuntimeError, match="this Energon loader was closed; build a new one"):
        resumed.state_dict()


def test_restore_into_an_iterated_loader_is_refused(energon_dataset, tokenizer):
    loader = make_loader(energon_dataset, tokenizer)
    state = loader.state_dict()
    iter(loader)
    with pytest.raises(RuntimeError) as error:
        loader.load_state_dict(state)
    assert str(error.value) == (
        "cannot restore an Energon loader that already started iterating; build a fresh "
        "loader with the same arguments and call load_state_dict once, before iter()"
    )


@pytest.mark.parametrize("workers", [0, 2])
def test_a_second_restore_is_refused_and_the_first_one_stands(energon_dataset, tokenizer, workers):
    """Energon cannot take a restored loader back to its start (its initial state restores
    nothing): restoring the initial state after a later one would go on after the later one."""
    reference = make_loader(energon_dataset, tokenizer, workers=workers)
    initial, batches = reference.state_dict(), iter(reference)
    next(batches), next(batches)
    after_two, third = reference.state_dict(), unpacked_view(next(batches))[0]
    reference.close()
    loader = make_loader(energon_dataset, tokenizer, workers=workers)
    loader.load_state_dict(after_two)
    with pytest.raises(RuntimeError, match=r"^cannot restore an Energon loader that was restored already; build a fresh "):
        loader.load_state_dict(initial)
    assert unpacked_view(next(iter(loader)))[0] == third  # untouched by the refused restore
    loader.close()


# --------------------------------------------------------------------------- refusals


def _refusal(saved_loader, current_loader):
    with pytest.raises(ValueError) as error:
        current_loader.load_state_dict(torch_roundtrip(saved_loader.state_dict()))
    prefix = "Energon loader identity changed: "
    message = str(error.value)
    assert message.startswith(prefix), message
    return message[len(prefix) :].split("; ")


@pytest.mark.parametrize(
    ("saved", "current", "lines"),
    [
        (
            dict(logical_world_size=2, logical_rank=0),
            dict(logical_world_size=2, logical_rank=1),
            ["topology.logical_rank 0 -> 1"],
        ),
        (
            dict(),
            dict(logical_world_size=2),
            ["topology.logical_world_size 1 -> 2", "topology.mapper.slices 1 -> 2"],
        ),
        (dict(), dict(batch_size=2), ["batch_size 4 -> 2"]),
        (
            dict(),
            dict(split_role="validation"),
            ["shuffle True -> None", "split_role 'train' -> 'validation'"],
        ),
        (
            dict(),
            dict(energon={"shuffle_buffer_size": None}),
            ["loader.shuffle_buffer_size 100 -> None"],
        ),
        (
            dict(),
            dict(energon={"shuffle_buffer_size": 50}),
            ["loader.shuffle_buffer_size 100 -> 50"],
        ),
        (
            dict(),
            dict(energon={"num_workers": 2}),
            ["loader.num_workers 0 -> 2", "topology.mapper.slices 1 -> 2"],
        ),
        (
            dict(),
            dict(placement_fingerprint="placement-2"),
            ["topology.placement 'placement-1' -> 'placement-2'"],
        ),
        (dict(), dict(source={"virtual_epoch_length": 5}), ["source.virtual_epoch_length 4 -> 5"]),
        (
            dict(energon={"packing_buffer_size": 8}, **PACKING),
            dict(
                energon={"packing_buffer_size": 8},
                **{**PACKING, "packing_algorithm": "Modified_First_Fit_Decreasing"},
            ),
            ["packing_algorithm 'first_fit_decreasing' -> 'modified_first_fit_decreasing'"],
        ),
        (
            dict(energon={"packing_buffer_size": 8}, **PACKING),
            dict(energon={"packing_buffer_size": 8}, **{**PACKING, "max_sequences_per_bin": 2}),
            ["max_sequences_per_bin None -> 2"],
        ),
        (
            dict(energon={"packing_buffer_size": 8}, **PACKING),
            dict(
                energon={"packing_buffer_size": 8},
                **{**PACKING, "sequence_length_pad_multiple": 16},
            ),
            ["sequence_length_pad_multiple 8 -> 16"],
        ),
        (
            dict(energon={"packing_buffer_size": 8}, **PACKING),
            dict(energon={"packing_buffer_size": 8}, only_unmask_final=True, **PACKING),
            ["only_unmask_final False -> True"],
        ),
        (
            dict(),
            dict(energon={"packing_buffer_size": 8}, **PACKING),
            [
                "loader.packing_buffer_size None -> 8",
                "max_sequences_per_bin added None",
                "only_unmask_final added False",
                "packing_algorithm added 'first_fit_decreasing'",
                "sequence_length_pad_multiple added 8",
            ],
        ),
    ],
    ids=[
        "other_logical_rank",
        "world_size",
        "batch_size",
        "shuffle_and_role",
        "shuffle_off",
        "shuffle_buffer_size",
        "num_workers",
        "placement",
        "virtual_epoch_length",
        "packing_algorithm",
        "max_sequences_per_bin",
        "pad_multiple",
        "only_unmask_final",
        "packing_on",
    ],
)
def test_refusal_lists_exact_changes(energon_dataset, tokenizer, saved, current, lines):
    assert (
        _refusal(
            make_loader(energon_dataset, tokenizer, **saved), make_loader(energon_dataset, tokenizer, **current)
        )
        == lines
    )


def test_only_unmask_final_without_packing_is_not_part_of_the_identity(energon_dataset, tokenizer):
    saved = make_loader(energon_dataset, tokenizer)
    make_loader(energon_dataset, tokenizer, only_unmask_final=True).load_state_dict(saved.state_dict())


def test_a_copy_of_the_dataset_at_another_path_restores(energon_dataset, tokenizer, tmp_path):
    # the same dataset.index_uuid (content identity): only source.path differs, which is allowed
    copy_root = tmp_path / "copy"
    shutil.copytree(energon_dataset.root, copy_root)
    moved = copy.copy(energon_dataset)
    object.__setattr__(moved, "root", copy_root)
    original = make_loader(energon_dataset, tokenizer)
    batches = iter(original)
    next(batches)
    state = torch_roundtrip(original.state_dict())
    expected = unpacked_view(next(batches))[0]
    restored = make_loader(moved, tokenizer)
    restored.load_state_dict(state)
    assert unpacked_view(next(iter(restored)))[0] == expected
    assert restored.state_dict()["identity"]["source"]["path"] == str(copy_root)


def test_refusal_of_the_same_path_rewritten_with_other_data(
    tmp_path, chat_conversations, tokenizer
):
    root = tmp_path / "data"
    first = write_chat_dataset(root, chat_conversations[:100], samples_per_shard=10)
    saved = make_loader(first, tokenizer).state_dict()
    old_uuid = (root / ".nv-meta" / "index.uuid").read_text()
    shutil.rmtree(root)
    second = write_chat_dataset(root, chat_conversations[100:200], samples_per_shard=10)
    new_uuid = (root / ".nv-meta" / "index.uuid").read_text()
    assert old_uuid != new_uuid
    with pytest.raises(ValueError) as error:
        make_loader(second, tokenizer).load_state_dict(saved)
    assert str(error.value) == (
        f"Energon loader identity changed: dataset.index_uuid {old_uuid!r} -> {new_uuid!r}"
    )


def test_refusal_of_another_chat_template(energon_dataset, tokenizer):
    other = copy.deepcopy(tokenizer)
    other.chat_template = tokenizer.chat_template.replace("<|im_start|>", "<|im_start|> ", 1)
    saved, current = make_loader(energon_dataset, tokenizer), make_loader(energon_dataset, other)
    old, new = (loader.identity["adapter"]["chat_template_sha256"] for loader in (saved, current))
    assert old != new
    assert _refusal(saved, current) == [f"adapter.chat_template_sha256 {old!r} -> {new!r}"]


def test_refusals_come_in_the_documented_order(energon_dataset, tokenizer):
    state = make_loader(energon_dataset, tokenizer).state_dict()
    changed = make_loader(energon_dataset, tokenizer, batch_size=2)

    def refuse(loader, **edits):
        broken = {**state, **edits}
        with pytest.raises((RuntimeError, ValueError)) as error:
            loader.load_state_dict(broken)
        return str(error.value)

    iterated = make_loader(energon_dataset, tokenizer, batch_size=2)
    iter(iterated)
    assert refuse(iterated, backend="torch").startswith("cannot restore an Energon loader")
    assert refuse(changed, backend="torch", format_version=1) == (
        "loader state backend is 'torch', expected 'energon'; this state was saved by another "
        "dataloader backend"
    )
    assert refuse(changed, format_version=1) == (
        "loader state format_version is 1, this loader reads only format 2"
    )
    assert (
        refuse(changed, loader_state=[1, 2]) == "Energon loader identity changed: batch_size 4 -> 2"
    )
    same = make_loader(energon_dataset, tokenizer)
    assert refuse(same, loader_state=[1, 2]) == (
        "loader_state must be a uint8 tensor of the encoded Energon rank state, got list"
    )
    assert refuse(same, loader_state=torch.zeros(3)) == (
        "loader_state must be a uint8 tensor of the encoded Energon rank state, got torch.float32"
    )


# --------------------------------------------------------------------------- partitioning and splits


def test_logical_ranks_are_disjoint_and_cover_the_split(energon_dataset, tokenizer):
    keys = energon_dataset.split_keys["train"]
    per_rank = []
    for rank in range(3):
        loader = make_loader(
            energon_dataset,
            tokenizer,
            split_role="validation",
            logical_rank=rank,
            logical_world_size=3,
        )
        per_rank.append(all_ids(loader))
    assert [len(ids) for ids in per_rank] == [64, 64, 64]
    assert per_rank == [keys[0:64], keys[64:128], keys[128:192]]  # contiguous, in order


def test_shuffled_train_ranks_stay_disjoint(energon_dataset, tokenizer):
    seen = [
        set(
            all_ids(
                make_loader(
                    energon_dataset,
                    tokenizer,
                    logical_rank=r,
                    logical_world_size=2,
                    source={"virtual_epoch_length": 12},
                )
            )
        )
        for r in range(2)
    ]
    assert not seen[0] & seen[1]
    assert seen[0] <= set(energon_dataset.split_keys["train"][:96])
    assert seen[1] <= set(energon_dataset.split_keys["train"][96:])


def test_validation_keeps_order_and_the_last_partial_batch(energon_dataset, tokenizer):
    loader = make_loader(
        energon_dataset, tokenizer, split_role="validation", source={"split": "val"}, batch_size=5
    )
    batches = [unpacked_view(b)[0] for b in loader]
    assert [len(b) for b in batches] == [5, 5, 5, 5, 4]
    assert [i for b in batches for i in b] == energon_dataset.split_keys["val"]
    assert loader.identity["shuffle"] is None
    # a second pass gives the same batches again
    assert [unpacked_view(b)[0] for b in loader] == batches


def test_validation_limit(energon_dataset, tokenizer):
    loader = make_loader(
        energon_dataset,
        tokenizer,
        split_role="validation",
        source={"split": "val", "limit": 2},
        batch_size=5,
    )
    assert all_ids(loader) == energon_dataset.split_keys["val"][:10]


# --------------------------------------------------------------------------- argument checks


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(data_config={"energon": None}), None),
        (
            dict(processor=None),
            "processor is None; a tokenizer or a processor (with .tokenizer) is required",
        ),
        (dict(batch_size=0), "batch_size must be an integer >= 1, got 0"),
        (
            dict(placement_fingerprint=""),
            "placement_fingerprint is empty; pass the fingerprint of the logical placement so a "
            "state saved under another placement is refused",
        ),
        (dict(split_role="test"), "split_role must be one of ('train', 'validation'), got 'test'"),
        (
            dict(energon={"packing_buffer_size": 8}),
            "packing_buffer_size is 8 but packing_algorithm is None; set a packing algorithm or "
            "remove packing_buffer_size",
        ),
        (
            dict(packing_algorithm="first_fit_decreasing"),
            "packing_algorithm is 'first_fit_decreasing' but packing_buffer_size is not set; set "
            "data_config['energon']['packing_buffer_size'] to pack",
        ),
        (
            dict(energon={"packing_buffer_size": 8}, packing_algorithm="best_fit"),
            "unknown packing algorithm 'best_fit'; expected one of: concatenative, "
            "first_fit_decreasing, first_fit_shuffle, modified_first_fit_decreasing, "
            "greedy_knapsack, balanced_greedy_knapsack",
        ),
        (
            dict(data_config={"shuffle": False}),
            "data_config['shuffle'] is False, expected True: a train loader always shuffles; set "
            "data_config['shuffle'] = True (or read the split with split_role 'validation')",
        ),
        (
            dict(energon={"num_wokers": 2}),
            "invalid data_config['energon'] (EnergonLoaderConfig): num_wokers=2: Extra inputs are "
            "not permitted",
        ),
        (
            dict(logical_rank=2, logical_world_size=2),
            "logical_rank must be in [0, 2) for logical_world_size 2, got 2",
        ),
        (dict(logical_world_size=0), "logical_world_size must be an integer >= 1, got 0"),
    ],
)
def test_build_argument_checks(energon_dataset, tokenizer, overrides, message):
    with pytest.raises(ValueError) as error:
        make_loader(energon_dataset, tokenizer, **overrides)
    if message is not None:  # a ConfigError (the spec's problems, refused together) or one ValueError
        found = error.value.problems if isinstance(error.value, ConfigError) else [str(error.value)]
        assert any(problem.startswith(message) for problem in found), str(error.value)


def test_missing_energon_block_and_epoch_length(energon_dataset, tokenizer):
    arguments = dict(
        source={"path": energon_dataset.path, "split": "train"},
        processor=tokenizer,
        batch_size=4,
        max_sequence_length=MAX_LEN,
        split_role="train",
        logical_rank=0,
        logical_world_size=1,
        placement_fingerprint="p",
        packing_algorithm=None,
        max_sequences_per_bin=None,
        sequence_length_pad_multiple=1,
        only_unmask_final=False,
    )
    with pytest.raises(ValueError) as error:
        build_energon_sft_loader(data_config={"shuffle": True}, **arguments)
    assert str(error.value) == (
        "data_config has no 'energon' block; add data_config['energon'] with the Energon loader "
        "settings (an empty mapping uses the defaults)"
    )
    arguments["source"] = {**arguments["source"], "epoch_mode": "virtual"}
    with pytest.raises(ConfigError) as error:
        build_energon_sft_loader(data_config={"energon": {}, "shuffle": True}, **arguments)
    assert str(error.value) == (
        f"the train loader of {energon_dataset.path!r} was not built: train source {energon_dataset.path!r} has "
        "epoch_mode 'virtual' and virtual_epoch_length 0, expected a length > 0: virtual mode repeats the data "
        "forever, so a for loop needs a length in batches; set virtual_epoch_length, or use epoch_mode 'exact' "
        "(0: one pass per for loop)"
    )


def test_worker_config_uses_the_compact_handler():
    config = _worker_config(
        EnergonLoaderConfig(num_workers=3, seed_offset=7), logical_rank=1, logical_world_size=4
    )
    assert (config.rank, config.world_size, config.num_workers, config.seed_offset) == (1, 4, 3, 7)
    assert config.global_error_handler is compact_sample_error_handler
    assert config.restore_error_handler is compact_sample_error_handler


def test_len_is_the_virtual_epoch_length(energon_dataset, tokenizer):
    loader = make_loader(energon_dataset, tokenizer, source={"virtual_epoch_length": 6})
    assert isinstance(loader, EnergonSFTDataLoader)
    assert len(loader) == 6
    assert len(list(loader)) == 6


# --------------------------------------------------------------------------- bad samples


def _skip_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped sample: ")]


def test_corrupt_samples_are_logged_counted_and_skipped(corrupt_energon_dataset, tokenizer, caplog):
    dataset = corrupt_energon_dataset
    caplog.set_level(logging.WARNING, logger="rl_data.energon.failure_budget")
    loader = make_loader(dataset, tokenizer, split_role="validation", batch_size=8)
    ids = all_ids(loader)
    assert ids == dataset.good_keys("train")
    assert loader.skipped_samples == 3
    lines = _skip_lines(caplog)
    assert len(lines) == 3
    prefix = f"skipped sample: dataset={dataset.path} shard=shards/shard-"
    assert lines == [
        f"{prefix}000002.tar index=50 key=corrupt-00050-invalid-json: JSONDecodeError: "
        "Expecting property name enclosed in double quotes: line 1 column 47 (char 46)",
        f"{prefix}000007.tar index=150 key=corrupt-00150-unknown-role: ValueError: "
        "message 0: unknown role 'robot'; expected one of 'system', 'user', 'assistant', 'tool'",
        f"{prefix}000012.tar index=250 key=corrupt-00250-empty-messages: ValueError: sample "
        "'corrupt-00250-empty-messages' has no messages (found []); an SFT sample needs a "
        "non-empty 'messages' list",
    ]


@pytest.mark.timeout(120)
def test_skips_in_worker_processes_reach_the_loader(corrupt_energon_dataset, tokenizer):
    loader = make_loader(
        corrupt_energon_dataset,
        tokenizer,
        split_role="validation",
        batch_size=8,
        energon={"num_workers": 2},
    )
    assert sorted(all_ids(loader)) == sorted(corrupt_energon_dataset.good_keys("train"))
    assert loader.skipped_samples == 3
    loader.close()


def test_skip_ratio_above_the_budget_is_fatal(corrupt_energon_dataset, tokenizer):
    loader = make_loader(
        corrupt_energon_dataset,
        tokenizer,
        split_role="validation",
        batch_size=8,
        energon={"max_failure_ratio": 0.005, "failure_ratio_min_samples": 50},
    )
    with pytest.raises(SampleFailureBudgetExceeded) as error:
        all_ids(loader)
    assert str(error.value) == (
        f"Energon source {corrupt_energon_dataset.path!r} (split 'train'): 1 of 57 samples were "
        "skipped (1.8%), more than max_failure_ratio 0.005; fix the data or the task encoder "
        "(see the 'skipped sample' log lines), or raise max_failure_ratio in data_config['energon']"
    )


@pytest.fixture(scope="module")
def broken_tokenizer(tokenizer):
    broken = copy.deepcopy(tokenizer)
    broken.chat_template = "{{ raise_exception('this chat template is broken') }}"
    return broken


def test_an_always_failing_encoder_on_a_small_split_is_fatal(
    energon_dataset, broken_tokenizer, caplog
):
    caplog.set_level(logging.WARNING, logger="rl_data.energon.failure_budget")
    loader = make_loader(
        energon_dataset, broken_tokenizer, split_role="validation", source={"split": "val"}
    )
    with pytest.raises(SampleFailureBudgetExceeded) as error:
        list(loader)
    assert str(error.value) == (
        f"Energon source {energon_dataset.path!r} (split 'val'): a whole pass yielded no batch "
        "and skipped 24 sample(s); every sample failed, so the data or the task encoder is "
        "systematically broken (see the 'skipped sample' log lines)"
    )
    assert loader.skipped_samples == 24
    assert len(_skip_lines(caplog)) == 24
    assert "this chat template is broken" in _skip_lines(caplog)[0]


def test_an_always_failing_train_encoder_hits_the_consecutive_limit(
    energon_dataset, broken_tokenizer
):
    loader = make_loader(energon_dataset, broken_tokenizer, energon={"max_consecutive_failures": 10})
    with pytest.raises(SampleFailureBudgetExceeded) as error:
        next(iter(loader))
    message = str(error.value)
    assert message.startswith(
        f"Energon source {energon_dataset.path!r} (split 'train'): a pipeline stage failed 10 "
        "times in a row, so the data or the task encoder is systematically broken"
    ), message
    assert loader.skipped_samples == 10


def test_handler_uses_the_cause_when_sources_are_unknown(caplog):
    caplog.set_level(logging.WARNING, logger="rl_data.energon.failure_budget")
    try:
        try:
            raise ValueError("Expecting value: line 1 column 2")
        except ValueError as cause:
            raise RuntimeError("decoding failed") from cause
    except RuntimeError as error:
        compact_sample_error_handler(error, {"__key__": "k1"}, None)
    assert _skip_lines(caplog) == [
        "skipped sample: key=k1: ValueError: Expecting value: line 1 column 2"
    ]


@pytest.mark.timeout(60)
def test_state_dict_after_a_failed_first_batch_with_workers_does_not_hang(
    energon_dataset, broken_tokenizer, tokenizer
):
    # Energon's iteration started but produced no batch: saving live would wait forever
    energon = {"num_workers": 2, "max_consecutive_failures": 5}
    loader = make_loader(energon_dataset, broken_tokenizer, energon=energon)
    with pytest.raises(SampleFailureBudgetExceeded):
        next(iter(loader))
    state = loader.state_dict()
    loader.close()
    fresh = make_loader(energon_dataset, broken_tokenizer, energon=energon)
    assert torch.equal(state["loader_state"], fresh.state_dict()["loader_state"])


def test_module_exports_match_the_reference_api():
    from rl_data.energon import identity, sft_dataloader

    assert sft_dataloader.__all__ == [
        "EnergonSFTDataLoader",
        "SFTDataLoader",
        "build_energon_sft_loader",
    ]
    assert sft_dataloader._V2_STATE_FORMAT_VERSION == 2
    for name in ("_v2_topology", "_loader_identity"):
        assert getattr(sft_dataloader, name) is getattr(identity, name)
    # the reference page's private helpers, over the public rl_data.fingerprint
    saved, current = {"a": 1, "b": "x" * 100}, {"a": 2, "b": "x" * 100}
    assert sft_dataloader._identity_fingerprint(saved) == fingerprint(saved)
    assert sft_dataloader._identity_differences(saved, current) == ["a 1 -> 2"]
    assert sft_dataloader._brief("x" * 100) == "'" + "x" * 76 + "..."
    assert sft_dataloader._loader_config({"num_workers": 2}).num_workers == 2


UNCLOSED_AT_EXIT = """
import sys
from energon_fixtures import make_loader
from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

loader = make_loader(sys.argv[1], load_qwen3_tokenizer(), workers=int(sys.argv[2]))
next(iter(loader))
print("leaving the loader open", flush=True)
"""


@pytest.mark.parametrize("workers", [0, 1])
def test_a_loader_left_open_at_interpreter_exit_prints_nothing(energon_dataset, workers):
    """A script that never closes its loader ends cleanly: no "Exception ignored in __del__" from
    a close() whose modules the interpreter already tore down."""
    tests = Path(__file__).parent
    result = subprocess.run([sys.executable, "-c", UNCLOSED_AT_EXIT, str(energon_dataset.path), str(workers)],
                            capture_output=True, text=True, timeout=120, cwd=tests.parent,
                            env={**os.environ, "PYTHONPATH": str(tests)})  # fmt: skip
    assert result.returncode == 0 and "leaving the loader open" in result.stdout, result.stderr[-2000:]
    assert "Exception ignored" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
