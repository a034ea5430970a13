"""The ``rl_prompt`` task: adapters and checks on realistic rows, DatumSpec batches from real
Energon datasets, ``idx`` stable across restores and world sizes, long prompts filtered."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from energon_fixtures import make_loader
from megatron.energon import SourceInfo
from preprocess_fixtures import GSM8K_ROW, read_quarantine, read_shards, write_jsonl
from restore_check import assert_restores_at_every_step
from typing_extensions import get_type_hints

from rl_data.energon.dataset_writer import write_energon_dataset
from rl_data.energon.sample_format import encode_sample
from rl_data.energon.sft_dataloader import EnergonSFTDataLoader
from rl_data.energon.task_encoders.adapter import ProcessorAdapter
from rl_data.interfaces import DatumSpec
from rl_data.preprocess.adapters import detect_adapter, resolve_adapter
from rl_data.preprocess.validation import RowRejected, validate_sample
from rl_data.prompt_data import arithmetic_word_problems
from rl_data.task_registry import get_task
from rl_data.tasks.rl_prompt import RLPromptSample

MAX_LEN = 160
GENERATION_PROMPT = "<|im_start|>assistant\n"
#: Rows (of 64) whose question is padded past MAX_LEN tokens: filtered by the loader.
LONG_ROWS = (5, 17, 30, 44, 58)
TASK = get_task("rl_prompt")


# -- adapters and checks ---------------------------------------------------------------------


def test_gsm8k_row_becomes_the_question_with_its_final_answer_as_ground_truth():
    sample = resolve_adapter("gsm8k")(GSM8K_ROW)
    assert sample == {"kind": "rl_prompt", "messages": [{"role": "user", "content": GSM8K_ROW["question"]}],
                      "extra_env_info": {"ground_truth": "72"}, "task_name": "math"}
    validate_sample(sample)
    big = resolve_adapter("gsm8k")({"question": "How many?", "answer": "600 + 634 = 1,234\n#### 1,234",
                                    "system": "Think step by step.", "task_name": "gsm8k",
                                    "stop_strings": ["</answer>"]})
    assert big["extra_env_info"] == {"ground_truth": "1234"}
    assert big["messages"] == [{"role": "system", "content": "Think step by step."}, {"role": "user", "content": "How many?"}]
    assert (big["task_name"], big["stop_strings"]) == ("gsm8k", ["</answer>"])
    assert not any("600 + 634" in m["content"] for m in big["messages"])


def test_prompt_and_message_rows_keep_their_env_info():
    assert resolve_adapter("prompt_ground_truth")({"prompt": "What is 3 * 6?", "ground_truth": 18}) == {
        "kind": "rl_prompt", "messages": [{"role": "user", "content": "What is 3 * 6?"}],
        "extra_env_info": {"ground_truth": "18"}, "task_name": "math"}
    messages = [{"role": "system", "content": "Answer in Python."}, {"role": "user", "content": "Reverse a list."}]
    env = {"tests": ["assert f([1, 2]) == [2, 1]"], "entry_point": "f"}
    sample = resolve_adapter("env_info")({"messages": messages, "extra_env_info": env, "task_name": "code"})
    assert (sample["messages"], sample["extra_env_info"], sample["task_name"]) == (messages, env, "code")
    merged = resolve_adapter("rl_messages")({"messages": messages, "ground_truth": "[2, 1]", "extra_env_info": env})
    assert merged["extra_env_info"] == {**env, "ground_truth": "[2, 1]"}
    for sample in (sample, merged):
        validate_sample(sample)


USER = {"role": "user", "content": "What is 2 + 2?"}


@pytest.mark.parametrize(("adapter", "row", "reason"), [
    ("gsm8k", {"question": "How many?", "answer": "She has 4 apples."}, "no_ground_truth"),
    ("prompt_ground_truth", {"prompt": "What is 2 + 2?", "ground_truth": "  "}, "no_ground_truth"),
    ("env_info", {"prompt": "What is 2 + 2?", "extra_env_info": {}}, "no_ground_truth"),
    ("rl_messages", {"messages": [USER, {"role": "assistant", "content": "4"}], "ground_truth": "4"}, "ends_with_assistant"),
    ("env_info", {"prompt": "What is 2 + 2?", "extra_env_info": "4"}, "invalid_env_info"),
    ("env_info", {"messages": [USER], "extra_env_info": ["4"]}, "invalid_env_info"),
    ("prompt_ground_truth", {"prompt": "What is 2 + 2?", "ground_truth": [4]}, "invalid_env_info"),
    ("env_info", {"prompt": "x", "extra_env_info": {"ground_truth": "4"}, "ground_truth": "5"}, "invalid_env_info"),
    ("prompt_ground_truth", {"prompt": "What is 2 + 2?", "ground_truth": "4", "stop_strings": "\n\n"}, "invalid_stop_strings"),
    ("rl_messages", {"messages": [{"role": "system", "content": "Be brief."}], "ground_truth": "4"}, "missing_field"),
    ("rl_messages", {"messages": [{"role": "user", "content": ""}], "ground_truth": "4"}, "empty_content"),
])
def test_bad_rows_get_their_reason(adapter, row, reason):
    with pytest.raises(RowRejected) as rejected:
        validate_sample(resolve_adapter(adapter)(row))
    assert rejected.value.reason == reason


def test_detection_among_the_task_adapters_leaves_sft_rows_alone():
    messages = [USER]
    assert detect_adapter([{"prompt": "p", "ground_truth": "1"}] * 2, TASK.adapters) == "prompt_ground_truth"
    assert detect_adapter([{"messages": messages, "ground_truth": "4"}] * 2, TASK.adapters) == "rl_messages"
    assert detect_adapter([{"messages": messages, "extra_env_info": {"a": 1}}] * 2, TASK.adapters) == "env_info"
    assert detect_adapter([{"messages": messages}] * 2) == "openai"
    assert detect_adapter([GSM8K_ROW] * 2) == "prompt_response"


# -- a real dataset --------------------------------------------------------------------------


def _rows() -> list[dict]:
    rows = arithmetic_word_problems(64)
    for row in LONG_ROWS:
        rows[row] = {**rows[row], "question": "Here is a long story about the market. " * 30 + rows[row]["question"]}
    return rows


@pytest.fixture(scope="module")
def prompt_dataset(tmp_path_factory):
    """64 GSM8K-style prompts (5 too long) in shards of 4, and each split's keys in split order."""
    root = tmp_path_factory.mktemp("rl_prompts")
    adapt = resolve_adapter("gsm8k")
    samples = []
    for row, raw in enumerate(_rows()):
        sample = adapt(raw)
        validate_sample(sample)
        samples.append((f"prompt-{row:03d}", encode_sample({**sample, "source": {"file": "gsm8k", "row": row}})))
    shards = write_energon_dataset(root, samples, samples_per_shard=4)
    split_keys = {split: [key for path in paths for key, _ in samples[int(Path(path).stem.split("-")[1]) * 4:][:4]]
                  for split, paths in shards.items()}
    return root, split_keys, {key: json.loads(members["json"]) for key, members in samples}


#: Prompts in exact passes (train split, or val for role "validation"), batches of 4.
LOADER = {
    "energon": {"task": "rl_prompt", "shuffle_buffer_size": 6, "max_samples_per_sequence": 2, "checkpoint_every_sec": 0.5},
    "source": {"epoch_mode": "exact", "virtual_epoch_length": 0},
    "max_sequence_length": MAX_LEN,
}
LEFT_PADDED = {"task": {"generation_padding": "left"}}


def _one_pass(loader) -> list:
    batches = list(loader)
    loader.close()
    return batches


def _long(key: str) -> bool:
    return int(key.split("-")[1]) in LONG_ROWS


def test_batches_hold_exactly_the_datum_spec_fields(prompt_dataset, tokenizer):
    root, _, stored = prompt_dataset
    batch = _one_pass(make_loader(root, tokenizer, **LOADER, role="validation", data_config=LEFT_PADDED))[0]
    hints = get_type_hints(DatumSpec)
    datum_fields = {"message_log", "length", "extra_env_info", "loss_multiplier", "idx", "task_name", "stop_strings"}
    assert set(batch) == datum_fields | {"source_ids", "input_ids", "input_lengths"}
    assert datum_fields <= set(hints) and {k for k in hints if k not in DatumSpec.__optional_keys__} <= datum_fields
    assert batch["length"].dtype == batch["idx"].dtype == torch.long and batch["loss_multiplier"].dtype == torch.float32
    assert batch["loss_multiplier"].tolist() == [1.0] * batch.size
    for row, key in enumerate(batch["source_ids"]):
        log, sample = batch["message_log"][row], stored[key]
        assert [m["role"] for m in log] == ["user"]
        assert batch["extra_env_info"][row] == sample["extra_env_info"] and batch["task_name"][row] == "math"
        assert batch["stop_strings"][row] is None
        assert batch["length"][row] == sum(len(m["token_ids"]) for m in log) == batch["input_lengths"][row]
        assert sample["messages"][0]["content"] in log[0]["content"]


def test_prompt_messages_carry_the_plain_prompt_after_the_task_prompts(prompt_dataset, tokenizer):
    """For trainers that apply the chat template themselves (TRL): the same prompt, not templated."""
    root, _, stored = prompt_dataset
    system = "Solve the problem. End with '#### <answer>'."
    with_messages = {"task": {"generation_padding": "left", "prompt_messages": True}, "system_prompt": system}
    loader = make_loader(root, tokenizer, **LOADER, role="validation", data_config=with_messages)
    identity = loader.state_dict()["identity"]
    batch = _one_pass(loader)[0]
    for row, key in enumerate(batch["source_ids"]):
        messages = [{"role": "system", "content": system}, *stored[key]["messages"]]
        assert batch["messages"][row] == messages
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert "".join(m["content"] for m in batch["message_log"][row]) == rendered
    assert identity["task"]["config"] == {"generation_padding": "left", "prompt_messages": True}
    default = make_loader(root, tokenizer, **LOADER, role="validation", data_config=LEFT_PADDED)  # off: the identity is the one saved before the option
    assert default.state_dict()["identity"]["task"]["config"] == {"generation_padding": "left"}
    default.close()


def test_the_prompt_ends_with_the_generation_prompt(tokenizer):
    adapter = ProcessorAdapter.from_processor(tokenizer, TASK.adapter_overrides, MAX_LEN)
    encoder = TASK.build_encoder(config=TASK.config(None), processor=tokenizer, adapter=adapter, max_sequence_length=MAX_LEN)
    question = GSM8K_ROW["question"]
    sample = RLPromptSample(
        __key__="k", __restore_key__=(), __subflavors__={}, messages=[{"role": "user", "content": question}],
        __sources__=(SourceInfo(dataset_path="d", index=7, shard_name="s", file_names=("k.json",)),),
        extra_env_info={"ground_truth": "72"}, task_name="math", stop_strings=None, source={})
    encoded = encoder.encode_sample(sample)
    text = "".join(m["content"] for m in encoded.message_log)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    assert text == rendered and text.endswith(GENERATION_PROMPT) and encoded.idx == 7
    assert torch.cat([m["token_ids"] for m in encoded.message_log]).tolist() == tokenizer(rendered, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("padding", ["left", "right", "none"])
def test_generation_input_ids_are_padded_on_the_configured_side(prompt_dataset, tokenizer, padding):
    batches = _one_pass(make_loader(prompt_dataset[0], tokenizer, **LOADER, role="validation", data_config={"task": {"generation_padding": padding}}))
    pad = tokenizer.pad_token_id
    for batch in batches:
        if padding == "none":
            assert "input_ids" not in batch and "input_lengths" not in batch
            continue
        assert batch["input_ids"].shape == (batch.size, int(batch["length"].max()))
        for row, log in enumerate(batch["message_log"]):
            ids, width = torch.cat([m["token_ids"] for m in log]), batch["input_ids"].shape[1]
            tokens, padded = (slice(width - len(ids), width), slice(0, width - len(ids))) if padding == "left" else (
                slice(0, len(ids)), slice(len(ids), width))
            assert torch.equal(batch["input_ids"][row, tokens], ids)
            assert (batch["input_ids"][row, padded] == pad).all()


def _delivered_idx(root, tokenizer, *, world: int, num_workers: int) -> tuple[dict[str, int], int]:
    """``{key: idx}`` of one pass over every rank of ``world``, and the prompts they filtered."""
    found, filtered = {}, 0
    for rank in range(world):
        loader = make_loader(root, tokenizer, **LOADER, data_config=LEFT_PADDED, rank=rank, world=world, workers=num_workers, batch_size=1)
        for batch in loader:
            for key, idx in zip(batch["source_ids"], batch["idx"].tolist(), strict=True):
                assert key not in found, f"{key} delivered twice"
                found[key] = idx
        filtered += loader.filtered_samples
        loader.close()
    return found, filtered


@pytest.mark.timeout(300)
def test_idx_is_the_position_in_the_split_for_every_world_size_and_worker_count(prompt_dataset, tokenizer):
    root, split_keys, _ = prompt_dataset
    train = split_keys["train"]
    expected = {key: position for position, key in enumerate(train) if not _long(key)}
    for world, num_workers in ((1, 0), (2, 0), (1, 2)):
        found, filtered = _delivered_idx(root, tokenizer, world=world, num_workers=num_workers)
        assert found == expected, f"world {world}, {num_workers} workers"
        assert filtered == sum(map(_long, train)) > 0
    assert set(expected.values()) | {i for i, key in enumerate(train) if _long(key)} == set(range(len(train)))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_long_prompts_are_filtered_counted_and_never_cut(prompt_dataset, tokenizer, num_workers):
    root, split_keys, stored = prompt_dataset
    loader = make_loader(root, tokenizer, **LOADER, data_config=LEFT_PADDED, workers=num_workers)
    batches = list(loader)
    delivered = [key for batch in batches for key in batch["source_ids"]]
    long_keys = [key for key in split_keys["train"] if _long(key)]
    assert loader.filtered_samples == len(long_keys) > 0
    assert not set(delivered) & set(long_keys)
    assert len(delivered) + loader.dropped_samples + len(long_keys) == len(split_keys["train"])
    assert loader.skipped_samples == 0
    assert max(int(b["length"].max()) for b in batches) <= MAX_LEN
    stats = [TASK.batch_stats(b) for b in batches]
    assert sum(s.samples for s in stats) == len(delivered)
    assert sum(s.non_pad_tokens for s in stats) == sum(int(b["length"].sum()) for b in batches)
    loader.close()
    assert all(stored[key]["messages"][0]["content"].startswith("Here is a long story") for key in long_keys)


def _ids_and_tensors(batch):
    return list(batch["source_ids"]), {name: batch[name] for name in ("idx", "length", "input_ids")}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("num_workers", [0, 2], ids=["0_workers", "2_workers"])
def test_restore_after_every_batch_continues_the_same_stream(prompt_dataset, tokenizer, num_workers):
    root, split_keys, _ = prompt_dataset
    report = assert_restores_at_every_step(
        lambda: make_loader(root, tokenizer, **LOADER, data_config=LEFT_PADDED, workers=num_workers),
        steps=14, extract=_ids_and_tensors, close=EnergonSFTDataLoader.close,
    )
    assert report.epoch_starts  # the run crossed a pass boundary
    first_pass = [key for step in report.steps if step.epoch == 0 for key in step.ids]
    assert len(set(first_pass)) == len(first_pass) and not any(map(_long, first_pass))


def test_packing_is_refused(tokenizer):
    adapter = ProcessorAdapter.from_processor(tokenizer, TASK.adapter_overrides, MAX_LEN)
    with pytest.raises(ValueError, match=r"^RL prompts are not packed \(packing_algorithm=.first_fit_decreasing.\)"):
        TASK.build_encoder(config=TASK.config(None), processor=tokenizer, adapter=adapter,
                           max_sequence_length=MAX_LEN, packing_algorithm="first_fit_decreasing")
    sft_adapter = ProcessorAdapter.from_processor(tokenizer, {}, MAX_LEN)
    with pytest.raises(ValueError, match="add_generation_prompt True and add_eos False"):
        TASK.build_encoder(config=TASK.config(None), processor=tokenizer, adapter=sft_adapter, max_sequence_length=MAX_LEN)


# -- preprocess end to end -------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_preprocess_writes_prompts_and_quarantines_rows_without_an_answer(ray_session, tmp_path):
    from rl_data.preprocess.pipeline import PreprocessConfig, run_preprocess

    rows = arithmetic_word_problems(20) + [{"question": "How many pens?", "answer": "She keeps 3 pens."}]
    write_jsonl(tmp_path / "gsm8k.jsonl", rows)
    summary = run_preprocess(PreprocessConfig(inputs=[str(tmp_path / "gsm8k.jsonl")], output=str(tmp_path / "out"),
                                              task="rl_prompt", progress=False,
                                              target_shard_rows=4))
    assert (summary.adapter, summary.accepted, summary.quarantined_by_reason) == ("gsm8k", 20, {"no_ground_truth": 1})
    assert [r["reason"] for r in read_quarantine(tmp_path / "out")] == ["no_ground_truth"]
    samples = list(read_shards(tmp_path / "out").values())
    assert {s["kind"] for s in samples} == {"rl_prompt"}
    truths = {s["messages"][0]["content"]: s["extra_env_info"]["ground_truth"] for s in samples}
    assert truths == {r["question"]: r["answer"].rsplit("#### ", 1)[1] for r in rows[:20]}
