"""Preference pairs through the Energon loader: encoding, batches, truncation, restore, refusals."""

from __future__ import annotations

import json
import logging
from functools import partial

import pytest
import torch

from multimodal_fixtures import write_raw_dataset
from energon_fixtures import make_loader
from restore_check import assert_restores_at_every_step
from rl_data.energon.sample_format import encode_sample
from rl_data.energon.task_encoders import ProcessorAdapter
from rl_data.task_registry import get_task
from rl_data.energon.task_encoders.preference import PreferenceTaskEncoder

MAX_LEN = 256
PINNED = {
    "kind": "preference",
    "context": [{"role": "user", "content": "Hello assistant"}],
    "chosen": [{"role": "assistant", "content": "Hello user"}],
    "rejected": [{"role": "assistant", "content": "Go away"}],
    "source": {"file": "pinned", "row": 0},
}
USER_IDS = [151644, 872, 198, 9707, 17847, 151645, 198]
CHOSEN_IDS = [151644, 77091, 198, 9707, 1196, 151645]


def _pairs(conversations, count):
    """Preference records from real conversations: the reply of another conversation is rejected."""
    records = []
    for i in range(count):
        turns, other = conversations[i]["messages"], conversations[i + count]["messages"]
        records.append({
            "kind": "preference",
            "context": [turns[0]],
            "chosen": [{"role": "assistant", "content": turns[1]["content"]}],
            "rejected": [{"role": "assistant", "content": other[1]["content"]}],
            "source": {"file": "chitchat", "row": i},
        })
    return records


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, chat_conversations):
    """40 pairs (the pinned pair first) in 10 shards of 4: train 32, val 8."""
    root = tmp_path_factory.mktemp("preference")
    usable = [c for c in chat_conversations if len(c["messages"]) >= 2 and c["messages"][0]["role"] == "user"]
    records = [PINNED] + _pairs(usable, 39)
    samples = [(f"pair-{i:03d}", encode_sample(r)) for i, r in enumerate(records)]
    split_keys = write_raw_dataset(root, samples, samples_per_shard=4, splits={"train": 8, "val": 2})
    return root, split_keys, dict(zip((k for k, _ in samples), records))


#: The shared loader builder with this module's defaults: the preference task, batches of 3.
preference_loader = partial(make_loader, energon={"task": "preference"}, batch_size=3, max_sequence_length=MAX_LEN)


def _encoder(tokenizer, max_len=MAX_LEN):
    adapter = ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=max_len)
    return PreferenceTaskEncoder(adapter=adapter, max_sequence_length=max_len)


def _encode(encoder, record):
    raw = {"__key__": "k", "__restore_key__": ("Test", 0), "__sources__": (), **encode_sample(record)}
    return encoder.encode_sample(encoder.cookers[0].cook(raw))


def test_a_pair_encodes_to_the_pinned_ids(tokenizer):
    encoded = _encode(_encoder(tokenizer), PINNED)
    assert [m["token_ids"].tolist() for m in encoded.message_log_chosen] == [USER_IDS, CHOSEN_IDS]
    rejected = [m["token_ids"].tolist() for m in encoded.message_log_rejected]
    assert rejected[0] == USER_IDS
    assert rejected[1] == [151644, 77091, 198] + tokenizer("Go away", add_special_tokens=False)["input_ids"] + [151645]
    assert (encoded.length_chosen, encoded.length_rejected) == (13, len(USER_IDS) + len(rejected[1]))
    assert encoded.loss_multiplier == 1.0


def test_validation_batches_have_the_preference_datum_shape(dataset, tokenizer):
    root, split_keys, records = dataset
    batches = list(preference_loader(root, tokenizer, role="validation"))
    assert [k for b in batches for k in b["source_ids"]] == split_keys["val"]
    adapter = ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=MAX_LEN)
    batch = batches[0]
    assert sorted(batch) == sorted(
        ["message_log_chosen", "message_log_rejected", "length_chosen", "length_rejected", "loss_multiplier", "source_ids"]
    )
    assert batch["length_chosen"].dtype == torch.long and batch["loss_multiplier"].dtype == torch.float32
    for row, key in enumerate(batch["source_ids"]):
        record = records[key]
        for side in ("chosen", "rejected"):
            want = adapter.format(record["context"] + record[side])
            got = batch[f"message_log_{side}"][row]
            assert [m["token_ids"].tolist() for m in got] == [m["token_ids"].tolist() for m in want]
            assert int(batch[f"length_{side}"][row]) == sum(len(m["token_ids"]) for m in want)
    assert len(batches) == 3 and [b.size for b in batches] == [3, 3, 2]


def test_an_over_long_completion_zeroes_the_pair(tokenizer):
    long_pair = dict(PINNED, rejected=[{"role": "assistant", "content": "no " * 40}])
    encoded = _encode(_encoder(tokenizer, max_len=32), long_pair)
    assert encoded.loss_multiplier == 0.0
    assert [len(m["token_ids"]) for m in encoded.message_log_rejected] == [4, 4]
    assert encoded.length_rejected == 8
    assert [m["token_ids"].tolist() for m in encoded.message_log_chosen] == [USER_IDS, CHOSEN_IDS]  # under the limit
    assert encoded.length_chosen == 13


@pytest.mark.timeout(120)
def test_restore_at_every_step(dataset, tokenizer):
    root, split_keys, _ = dataset

    def view(batch):
        tensors = {
            side: torch.cat([m["token_ids"] for log in batch[f"message_log_{side}"] for m in log])
            for side in ("chosen", "rejected")
        }
        tensors.update({k: batch[k] for k in ("length_chosen", "length_rejected", "loss_multiplier")})
        return batch["source_ids"], tensors

    report = assert_restores_at_every_step(lambda: preference_loader(root, tokenizer), steps=6, extract=view)
    assert report.epoch_starts == [4]
    assert set(report.ids) <= set(split_keys["train"])
    assert report.ids[:6] != split_keys["train"][:6]  # shuffled


def test_identity_names_the_preference_components_and_refuses_the_sft_encoder(dataset, tokenizer):
    root, _, _ = dataset
    loader = preference_loader(root, tokenizer)
    assert loader.identity["components"] == {"PreferenceTaskEncoder": 1, "PreferenceCooker": 1}
    assert loader.identity["loader"]["task_encoder"] == "preference"
    with pytest.raises(ValueError, match=r"^Energon loader identity changed: components.ChatCooker added 1; "):
        preference_loader(root, tokenizer, energon={"task": "chat_sft"}).load_state_dict(loader.state_dict())
    assert get_task("preference").encoder_class is PreferenceTaskEncoder


def test_packing_is_refused(dataset, tokenizer):
    root, _, _ = dataset
    # refused by the spec's checks, before any loader part is built (on the driver for a LoaderSpec)
    with pytest.raises(ValueError, match=r"task 'preference' does not pack its samples, but packing_algorithm is 'first_fit_decreasing'; remove packing_algorithm"):
        preference_loader(
            root,
            tokenizer,
            energon={"task": "preference", "packing_buffer_size": 8},
            packing_algorithm="first_fit_decreasing",
            sequence_length_pad_multiple=8,
        )


def test_bad_pairs_are_skipped_logged_and_counted(tmp_path, tokenizer, caplog):
    good = [(f"pair-{i}", encode_sample(dict(PINNED, source={"row": i}))) for i in range(4)]
    sft = {"kind": "sft", "messages": PINNED["context"] + PINNED["chosen"]}
    bad = [
        ("bad-sft-kind", {"json": json.dumps(sft).encode()}),
        ("bad-empty-rejected", {"json": json.dumps(dict(PINNED, rejected=[])).encode()}),
    ]
    split_keys = write_raw_dataset(tmp_path, good[:2] + bad + good[2:], samples_per_shard=3, splits={"train": 1})
    caplog.set_level(logging.WARNING, logger="rl_data.energon.failure_budget")
    loader = preference_loader(tmp_path, tokenizer, role="validation", source={"split": "train"})
    assert [k for b in loader for k in b["source_ids"]] == [k for k in split_keys["train"] if k.startswith("pair-")]
    assert loader.skipped_samples == 2
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipped sample: ")]
    prefix = f"skipped sample: dataset={tmp_path} shard=shards/shard-"
    assert lines == [
        f"{prefix}000000.tar index=2 key=bad-sft-kind: ValueError: sample 'bad-sft-kind' is a 'sft' sample; "
        "the preference cooker reads only kind 'preference' (tasks that read 'sft' samples: ['chat_sft', 'vlm_sft'])",
        f"{prefix}000001.tar index=3 key=bad-empty-rejected: ValueError: sample 'bad-empty-rejected': "
        "'rejected' must be a non-empty message list, found []",
    ]
