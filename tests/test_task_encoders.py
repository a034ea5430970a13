"""The SFT task encoders: adapter, cooker, encoding, truncation, batches, and real Energon runs."""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import shutil

import pytest
import torch
from megatron.energon import WorkerConfig, get_savable_loader, get_train_dataset, get_val_dataset
from megatron.energon.errors import reraise_exception

from rl_data.energon.dataset_writer import write_energon_dataset
from rl_data.energon.multimodal.task_encoders.base import BaseSFTTaskEncoder as SeedPathEncoder
from rl_data.energon.sample_format import encode_sample
from rl_data.energon.task_encoders import (
    BaseSFTTaskEncoder,
    ChatCooker,
    ChatSFTTaskEncoder,
    ProcessorAdapter,
)
from rl_data.task_registry import get_task

PINNED_MESSAGES = [
    {"role": "user", "content": "Hello assistant"},
    {"role": "assistant", "content": "Hello user"},
]
PINNED_USER_IDS = [151644, 872, 198, 9707, 17847, 151645, 198]
PINNED_ASSISTANT_IDS = [151644, 77091, 198, 9707, 1196, 151645]
MAX_LEN = 512


def _record(messages, **extra) -> dict:
    return {"kind": "sft", "messages": messages, "source": {"file": "t.jsonl", "row": 0}, **extra}


def _crude(key: str, payload: bytes) -> dict:
    return {"__key__": key, "__restore_key__": ("Test", 0), "__sources__": (), "json": payload}


def _encoder(tokenizer, max_len: int = MAX_LEN, **options) -> ChatSFTTaskEncoder:
    adapter = ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=max_len)
    return ChatSFTTaskEncoder(adapter=adapter, max_sequence_length=max_len, **options)


@pytest.fixture(scope="module")
def dataset_path(tmp_path_factory, chat_conversations):
    """48 samples in 12 shards: 36 train (the pinned conversation first), 12 val."""
    root = tmp_path_factory.mktemp("sft_dataset")
    records = [("pinned-0000", _record(PINNED_MESSAGES))]
    records += [(f"chat-{i:04d}", _record(c["messages"])) for i, c in enumerate(chat_conversations[:47])]
    write_energon_dataset(
        root,
        [(key, encode_sample(record)) for key, record in records],
        samples_per_shard=4,
        splits={"train": 0.75, "val": 0.25},
    )
    return root


QWEN3_VOCAB_SHA256 = "145980efdfb01c53b3f7ae954c2a305dc6ec9081bcfb3ef844cab642632bd007"


# -- adapter ------------------------------------------------------------------------------


def test_adapter_fingerprint_is_sha256_of_its_identity_and_tracks_every_field(tokenizer):
    adapter = ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=MAX_LEN)
    assert adapter.identity == {
        "tokenizer": "qwen3",
        "vocab_size": 151669,
        "vocab_sha256": QWEN3_VOCAB_SHA256,
        "chat_template": tokenizer.chat_template,
        "max_sequence_length": MAX_LEN,
        "add_bos": True,
        "add_eos": True,
        "add_generation_prompt": False,
    }
    canonical = json.dumps(adapter.identity, sort_keys=True, separators=(",", ":"))
    assert adapter.fingerprint == hashlib.sha256(canonical.encode()).hexdigest()
    variants = [
        ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=MAX_LEN + 1),
        ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=MAX_LEN, add_bos=False),
        ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=MAX_LEN, add_eos=False),
        ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=MAX_LEN, add_generation_prompt=True),
    ]
    other_template = copy.copy(tokenizer)
    other_template.chat_template = tokenizer.chat_template + "{# changed #}"
    variants.append(ProcessorAdapter(tokenizer=other_template, max_sequence_length=MAX_LEN))
    fingerprints = {adapter.fingerprint, *(v.fingerprint for v in variants)}
    assert len(fingerprints) == 6
    assert ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=MAX_LEN).fingerprint == adapter.fingerprint


def test_adapter_identity_does_not_depend_on_where_the_tokenizer_was_loaded_from(
    tokenizer, tmp_path
):
    from transformers import AutoTokenizer

    copied = tmp_path / "elsewhere" / "qwen3"
    shutil.copytree(tokenizer.name_or_path, copied)
    moved = AutoTokenizer.from_pretrained(str(copied))
    assert moved.name_or_path != tokenizer.name_or_path
    here = ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=MAX_LEN)
    there = ProcessorAdapter(tokenizer=moved, max_sequence_length=MAX_LEN)
    assert there.fingerprint == here.fingerprint


def test_adapter_from_processor_reads_flags_and_unwraps_processors(tokenizer):
    class Processor:
        def __init__(self, tok):
            self.tokenizer = tok

    adapter = ProcessorAdapter.from_processor(
        Processor(tokenizer), {"add_eos": False, "add_generation_prompt": True}, 64
    )
    assert adapter.tokenizer is tokenizer
    assert (adapter.add_bos, adapter.add_eos, adapter.add_generation_prompt) == (True, False, True)
    assert adapter.max_sequence_length == 64
    assert ProcessorAdapter.from_processor(tokenizer, {}, 64).tokenizer is tokenizer
    with pytest.raises(ValueError, match="processor is None"):
        ProcessorAdapter.from_processor(None, {}, 64)


# -- cooker -------------------------------------------------------------------------------


def test_cooker_turns_a_crude_sample_into_a_chat_sample():
    payload = encode_sample(_record(PINNED_MESSAGES, task_name="chat", tools=[{"name": "f"}]))["json"]
    sample = ChatCooker.cook(_crude("k-1", payload))
    assert sample.__key__ == "k-1"
    assert sample.__restore_key__ == ("Test", 0)
    assert sample.messages == PINNED_MESSAGES
    assert sample.tools == [{"name": "f"}]
    assert sample.source == {"file": "t.jsonl", "row": 0}
    assert sample.task_name == "chat"


@pytest.mark.parametrize(
    ("payload", "error", "message"),
    [
        (b'{"kind": "sft", "messages": [', json.JSONDecodeError, "Expecting value"),
        (json.dumps(_record([{"role": "wizard", "content": "x"}])).encode(), ValueError, "unknown role 'wizard'"),
        (json.dumps(_record([])).encode(), ValueError, "'k-1' has no messages"),
        (json.dumps({"kind": "preference", "context": []}).encode(), ValueError, "is a 'preference' sample"),
    ],
)
def test_cooker_raises_for_bad_samples(payload, error, message):
    with pytest.raises(error, match=message):
        ChatCooker.cook(_crude("k-1", payload))


def test_registry_names_the_valid_choices(builtin_tasks_only):
    assert get_task("chat_sft").encoder_class is ChatSFTTaskEncoder
    assert get_task("chat_sft").cooker(None) is ChatCooker
    assert SeedPathEncoder is BaseSFTTaskEncoder
    with pytest.raises(ValueError, match=r"unknown task 'sft'; registered tasks are \['chat_sft', 'preference', 'rl_prompt', 'vlm_sft'\]"):
        get_task("sft")
    with pytest.raises(ValueError, match=r"task 'chat_sft' has no cooker 'raw'; its cookers are \['chat'\]"):
        get_task("chat_sft").cooker("raw")


def test_component_versions_name_encoder_and_cooker(tokenizer):
    assert _encoder(tokenizer).component_versions == {"ChatSFTTaskEncoder": 1, "ChatCooker": 1}


# -- encoding and unpacked batches ---------------------------------------------------------


def _chat_sample(key: str = "pinned-0000", messages=PINNED_MESSAGES):
    return ChatCooker.cook(_crude(key, encode_sample(_record(messages))["json"]))


def test_encode_sample_gives_the_pinned_message_log(tokenizer):
    encoder = _encoder(tokenizer)
    encoded = encoder.encode_sample(_chat_sample())
    assert [m["role"] for m in encoded.message_log] == ["user", "assistant"]
    assert [m["token_ids"].tolist() for m in encoded.message_log] == [PINNED_USER_IDS, PINNED_ASSISTANT_IDS]
    assert [m["content"] for m in encoded.message_log] == [
        "<|im_start|>user\nHello assistant<|im_end|>\n",
        "<|im_start|>assistant\nHello user<|im_end|>",
    ]
    assert encoded.length == 13
    assert encoded.loss_multiplier == 1.0
    assert encoded.__key__ == "pinned-0000"
    assert encoded.adapter_fingerprint == encoder.adapter.fingerprint


def test_a_sample_reaching_max_length_is_truncated_with_zero_loss(tokenizer):
    just_fits = _encoder(tokenizer, max_len=14).encode_sample(_chat_sample())
    assert (just_fits.length, just_fits.loss_multiplier) == (13, 1.0)
    truncated = _encoder(tokenizer, max_len=13).encode_sample(_chat_sample())
    # min(4, 13 // 2) tokens of every message
    assert [m["token_ids"].tolist() for m in truncated.message_log] == [PINNED_USER_IDS[:4], PINNED_ASSISTANT_IDS[:4]]
    assert (truncated.length, truncated.loss_multiplier) == (8, 0.0)
    tiny = _encoder(tokenizer, max_len=6).encode_sample(_chat_sample())
    assert [m["token_ids"].tolist() for m in tiny.message_log] == [PINNED_USER_IDS[:3], PINNED_ASSISTANT_IDS[:3]]
    assert (tiny.length, tiny.loss_multiplier) == (6, 0.0)


def test_encode_sample_raises_for_malformed_messages(tokenizer):
    sample = _chat_sample()
    sample.messages = [{"role": "user"}]
    with pytest.raises(ValueError, match="missing key 'content'"):
        _encoder(tokenizer).encode_sample(sample)


@pytest.mark.parametrize("include_source_ids", [True, False])
def test_unpacked_batch_holds_message_logs_loss_multipliers_and_source_ids(tokenizer, include_source_ids):
    encoder = _encoder(tokenizer, max_len=13, include_source_ids=include_source_ids)
    long_ = encoder.encode_sample(_chat_sample("a"))
    short = encoder.encode_sample(_chat_sample("b", PINNED_MESSAGES[:1]))
    batch = encoder.batch([long_, short])
    expected_keys = {"message_log", "loss_multiplier"} | ({"source_ids"} if include_source_ids else set())
    assert set(batch) == expected_keys
    assert batch["loss_multiplier"].tolist() == [0.0, 1.0]
    assert batch["loss_multiplier"].dtype == torch.float32
    assert batch["message_log"][1][0]["token_ids"].tolist() == PINNED_USER_IDS[:-1]  # EOS-terminated
    if include_source_ids:
        assert batch["source_ids"] == ["a", "b"]
    assert batch.size == 2


# -- through Energon -----------------------------------------------------------------------


def _train_loader(path, encoder, *, packing_buffer_size=None, shuffle=True, handler=reraise_exception):
    worker_config = WorkerConfig(
        rank=0, world_size=1, num_workers=0, global_error_handler=handler, restore_error_handler=handler
    )
    dataset = get_train_dataset(
        path,
        split_part="train",
        worker_config=worker_config,
        batch_size=2,
        batch_drop_last=True,
        shuffle_buffer_size=8 if shuffle else None,
        max_samples_per_sequence=4 if shuffle else None,
        packing_buffer_size=packing_buffer_size,
        task_encoder=encoder,
    )
    return get_savable_loader(dataset, checkpoint_every_sec=3600)


def _take(loader, n: int) -> list:
    iterator = iter(loader)
    return [next(iterator) for _ in range(n)]


def _flatten_source_ids(batches, packed: bool) -> list[str]:
    if packed:
        return [key for batch in batches for pack in batch["source_ids"] for key in pack]
    return [key for batch in batches for key in batch["source_ids"]]


def test_unpacked_train_epoch_through_energon_yields_every_train_sample_once(tokenizer, dataset_path):
    encoder = _encoder(tokenizer)
    batches = _take(_train_loader(dataset_path, encoder, shuffle=False), 18)
    assert all(set(b) == {"message_log", "loss_multiplier", "source_ids"} for b in batches)
    keys = _flatten_source_ids(batches, packed=False)
    assert sorted(keys) == sorted(["pinned-0000"] + [f"chat-{i:04d}" for i in range(35)])
    row = keys.index("pinned-0000")
    log = batches[row // 2]["message_log"][row % 2]
    assert [m["token_ids"].tolist() for m in log] == [PINNED_USER_IDS, PINNED_ASSISTANT_IDS]
    rows = [(log, m) for b in batches for log, m in zip(b["message_log"], b["loss_multiplier"].tolist())]
    for log, multiplier in rows:
        truncated = all(len(message["token_ids"]) <= 4 for message in log)
        assert multiplier == (0.0 if truncated else 1.0)
        assert sum(len(message["token_ids"]) for message in log) <= MAX_LEN
    assert {multiplier for _, multiplier in rows} == {0.0, 1.0}  # some long chats were truncated
    gc.collect()


def test_packed_validation_split_through_energon_packs_every_sample_once(tokenizer, dataset_path):
    encoder = _encoder(tokenizer, packing_algorithm="first_fit_decreasing", sequence_length_pad_multiple=16)
    worker_config = WorkerConfig(rank=0, world_size=1, num_workers=0, global_error_handler=reraise_exception)
    dataset = get_val_dataset(
        dataset_path, split_part="val", worker_config=worker_config, batch_size=2,
        packing_buffer_size=6, task_encoder=encoder,
    )
    batches = list(get_savable_loader(dataset))
    keys = {
        "input_ids", "input_lengths", "token_mask", "sample_mask", "cu_seqlens",
        "cu_seqlens_padded", "packing_metrics", "source_ids",
    }
    assert all(set(b) == keys for b in batches)
    assert sorted(_flatten_source_ids(batches, packed=True)) == [f"chat-{i:04d}" for i in range(35, 47)]
    for batch in batches:
        assert batch["input_ids"].shape[1] <= MAX_LEN
        for row, (cu, cu_padded) in enumerate(zip(batch["cu_seqlens"].tensors, batch["cu_seqlens_padded"].tensors)):
            assert int(cu_padded[-1]) == int(batch["input_lengths"][row])
            assert all(int(p) % 16 == 0 for p in cu_padded)
            assert batch["token_mask"][row, cu_padded[:-1].long()].tolist() == [0.0] * (len(cu) - 1)
            assert batch["token_mask"][row, int(cu_padded[-1]):].sum() == 0
        assert batch["sample_mask"].tolist() == batch["token_mask"].any(1).float().tolist()
    gc.collect()


@pytest.mark.parametrize("packing", [False, True])
def test_restore_with_energon_state_continues_identically(tokenizer, dataset_path, packing):
    options = {"packing_algorithm": "first_fit_decreasing", "sequence_length_pad_multiple": 16} if packing else {}
    buffer = 6 if packing else None

    def loader():
        return _train_loader(dataset_path, _encoder(tokenizer, **options), packing_buffer_size=buffer)

    total, k = 9, 4
    reference = _take(loader(), total)
    first = loader()
    iterator = iter(first)
    for _ in range(k):
        next(iterator)
    state = first.save_state_rank()
    restored = loader()
    restored.restore_state_rank(state)
    continuation = _take(restored, total - k)
    for expected, got in zip(reference[k:], continuation):
        assert got["source_ids"] == expected["source_ids"]
        for key in ("input_ids", "token_mask", "input_lengths") if packing else ("loss_multiplier",):
            assert torch.equal(got[key], expected[key])
        if packing:
            assert [t.tolist() for t in got["cu_seqlens_padded"].tensors] == [
                t.tolist() for t in expected["cu_seqlens_padded"].tensors
            ]
        else:
            assert [[m["token_ids"].tolist() for m in log] for log in got["message_log"]] == [
                [m["token_ids"].tolist() for m in log] for log in expected["message_log"]
            ]
    gc.collect()


def test_bad_samples_raise_inside_energon_so_the_error_handler_skips_them(tokenizer, tmp_path):
    good = [(f"good-{i}", encode_sample(_record(PINNED_MESSAGES))) for i in range(5)]
    bad = [
        ("bad-json", {"json": b'{"kind": "sft", "messages": ['}),
        ("bad-role", encode_sample(_record([{"role": "wizard", "content": "x"}]))),
        ("bad-empty", encode_sample(_record([]))),
    ]
    write_energon_dataset(tmp_path, good[:2] + bad + good[2:], samples_per_shard=4, splits={"train": 1.0})
    errors: list[tuple[str, str]] = []

    def collect(exception, sample, sources):
        errors.append((sample["__key__"], type(exception).__name__))

    batches = _take(_train_loader(tmp_path, _encoder(tokenizer), shuffle=False, handler=collect), 5)
    assert sorted(set(errors)) == [
        ("bad-empty", "ValueError"), ("bad-json", "JSONDecodeError"), ("bad-role", "ValueError"),
    ]
    assert set(_flatten_source_ids(batches, packed=False)) == {f"good-{i}" for i in range(5)}
    gc.collect()
