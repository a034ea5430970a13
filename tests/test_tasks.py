"""The task registry, a toy task added in one module end to end, and the TaskDataSpec prompts."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
from distributed_fixtures import consume, reference_stream, running_coordinator, runtime_config
from energon_fixtures import SINGLE_RANK_UNPACKED
from preprocess_fixtures import read_quarantine, write_jsonl

from rl_data.distributed.config import LoaderSpec
from rl_data.energon.config import validate_data_config
from rl_data.energon.sft_dataloader import build_energon_sft_loader
from rl_data.energon.task_encoders.adapter import ProcessorAdapter
from rl_data.interfaces import TaskDataSpec
from rl_data.preprocess.validation import RowRejected, known_reasons, validate_sample
from rl_data.task_registry import get_task, register_task, registered_tasks, sample_schemas, schema_for_kind
from rl_data.tokenization.chat import apply_task_data_spec
from rl_data.tokenization.validation import TrustedText

TOY = "toy_task:TASK"
RANK_0_OF_1 = dict(logical_rank=0, logical_world_size=1, placement_fingerprint="placement-1")


# -- registry ----------------------------------------------------------------------------------


def test_builtin_tasks_and_their_stored_kinds(builtin_tasks_only):
    assert sorted(registered_tasks()) == ["chat_sft", "preference", "rl_prompt", "vlm_sft"]
    assert sorted(sample_schemas()) == ["preference", "rl_prompt", "sft"]
    assert get_task("vlm_sft").schema is get_task("chat_sft").schema
    assert schema_for_kind("preference").message_lists == ("context", "chosen", "rejected")
    assert {"identical_preference", "no_ground_truth"} <= set(known_reasons())


def test_a_loader_decoding_its_samples_imports_only_its_task():
    """Every sample is decoded and its kind checked; that must not import the other tasks (the
    RL task imports the runtime, math-verify, ...: a third of an Energon worker's start)."""
    script = (
        "import sys\n"
        "from rl_data.task_registry import get_task\n"
        "from rl_data.energon.sample_format import decode_sample, encode_sample\n"
        "get_task('chat_sft')\n"
        "members = encode_sample({'kind': 'sft', 'messages': [{'role': 'user', 'content': 'hi'}]})\n"
        "assert decode_sample(members)['kind'] == 'sft'\n"
        "print(sorted(m for m in sys.modules if m.startswith('rl_data.tasks.')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["['rl_data.tasks.chat_sft']"]


def test_lookup_errors_name_the_choices(builtin_tasks_only):
    with pytest.raises(ValueError, match=r"^unknown task 'sft'; registered tasks are \['chat_sft', 'preference', 'rl_prompt', 'vlm_sft'\]"):
        get_task("sft")
    with pytest.raises(ValueError, match=r"^cannot import task 'no_such_module_xyz:TASK': No module named"):
        get_task("no_such_module_xyz:TASK")
    with pytest.raises(ValueError, match=r"^'toy_task:ToyConfig' is a ModelMetaclass, not a rl_data.Task"):
        get_task("toy_task:ToyConfig")
    with pytest.raises(ValueError, match=r"^sample kind 'qa' is not one of \['preference', 'rl_prompt', 'sft'"):
        schema_for_kind("qa")


def test_a_different_task_under_a_taken_name_is_refused():
    import dataclasses

    chat = get_task("chat_sft")
    assert register_task(chat) is chat
    with pytest.raises(ValueError, match="a different task is already registered as 'chat_sft'"):
        register_task(dataclasses.replace(chat, supports_packing=False))


def test_misspelt_keys_fail_on_the_driver_naming_the_field():
    with pytest.raises(ValueError, match=r"^invalid data_config \(DataConfig\): shufle=True: Extra inputs are not permitted"):
        validate_data_config({"energon": {}, "shufle": True})
    with pytest.raises(ValueError, match=r"^invalid data_config\['task'\] \(options of task 'rl_prompt'\) \(RLPromptConfig\): "
                                         r"generation_padding='middle'"):
        validate_data_config({"energon": {"task": "rl_prompt"}, "task": {"generation_padding": "middle"}})
    with pytest.raises(ValueError, match=r"invalid source \(EnergonSourceConfig\): split: Field required; splitt='train': Extra inputs"):
        LoaderSpec(data_config={"energon": {}}, source={"path": "/d", "splitt": "train"}, batch_size=1, max_sequence_length=8)
    with pytest.raises(ValueError, match=r"unknown task 'chat'; registered tasks are"):
        LoaderSpec(data_config={"energon": {"task": "chat"}}, source={"path": "/d", "split": "train"},
                   batch_size=1, max_sequence_length=8)


# -- a toy task: one module (tests/toy_task.py), preprocess -> loader -> coordinator ----------


@pytest.fixture(scope="module")
def toy_dataset(tmp_path_factory, ray_session):
    from rl_data.preprocess.pipeline import PreprocessConfig, run_preprocess

    root = tmp_path_factory.mktemp("toy")
    rows = [{"q": f"What is {i} plus {i}?", "a": str(2 * i)} for i in range(40)] + [{"q": "Colour of sky?", "a": "blue"}]
    write_jsonl(root / "toy.jsonl", rows)
    summary = run_preprocess(PreprocessConfig(inputs=[str(root / "toy.jsonl")], output=str(root / "out"), task=TOY,
                                              splits={"train": 1.0}, target_shard_rows=8, progress=False))
    assert (summary.adapter, summary.accepted, summary.quarantined_by_reason) == ("toy_qa", 40, {"non_numeric": 1})
    assert [r["reason"] for r in read_quarantine(root / "out")] == ["non_numeric"]
    return str(root / "out")


def _toy_spec(dataset: str, **task_options) -> LoaderSpec:
    return LoaderSpec(
        data_config={"energon": {"task": TOY, "shuffle_buffer_size": 8, "max_samples_per_sequence": 4},
                     "shuffle": True, "task": task_options},
        source={"path": dataset, "split": "train", "virtual_epoch_length": 4},
        batch_size=4,
        max_sequence_length=128,
    )


def test_toy_task_loads_with_its_config_in_the_identity(toy_dataset, tokenizer):
    loader = build_energon_sft_loader(**_toy_spec(toy_dataset, shout=True).builder_kwargs(), processor=tokenizer,
                                      **RANK_0_OF_1)
    batch = next(iter(loader))
    assert loader.identity["task"] == {"name": "toy_qa", "config": {"shout": True}}
    user_text = tokenizer.decode(batch["input_ids"][0, : batch["input_lengths"][0]])
    assert "WHAT IS" in user_text and len(batch["source_ids"]) == 4
    quiet = build_energon_sft_loader(**_toy_spec(toy_dataset).builder_kwargs(), processor=tokenizer, **RANK_0_OF_1)
    with pytest.raises(ValueError, match=r"identity changed: task.config.shout True -> False"):
        quiet.load_state_dict(loader.state_dict())


@pytest.mark.timeout(300)
def test_toy_task_runs_through_the_coordinator_exactly_once(toy_dataset, tokenizer, ray_session):
    import ray

    config, spec = runtime_config(2, prefetch_depth=1), _toy_spec(toy_dataset)
    with running_coordinator(ray, config, spec) as coordinator:
        steps = consume(ray, coordinator, 4)
    assert steps == reference_stream(spec, config, tokenizer, 4)
    ids = [i for step in steps for rank in step for i in rank]
    assert len(ids) == len(set(ids)) == 4 * 2 * 4  # 32 of the 40 samples: one pass, no repeats


# -- TaskDataSpec prompts ----------------------------------------------------------------------


def apply_task_prompts(messages, *, prompt, system_prompt):
    spec = TaskDataSpec()
    spec.prompt, spec.system_prompt = prompt, system_prompt
    return apply_task_data_spec(messages, spec)


def test_prompt_formats_the_first_user_turn_and_system_prompt_is_added_when_missing():
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                {"role": "user", "content": "and 3+3?"}]
    out = apply_task_prompts(messages, prompt="Solve: {}\nAnswer with a number.", system_prompt="Be brief.")
    assert out == [{"role": "system", "content": "Be brief."},
                   {"role": "user", "content": "Solve: 2+2?\nAnswer with a number."},
                   {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3?"}]
    assert messages[0]["content"] == "2+2?"  # the input is not changed
    own_system = [{"role": "system", "content": "Mine."}, *messages]
    assert apply_task_prompts(own_system, prompt=None, system_prompt="Be brief.") == own_system


def test_prompt_skips_media_placeholders_and_keeps_them_trusted():
    placeholder = TrustedText("<|vision_start|><|image_pad|><|vision_end|>")
    message = {"role": "user", "content": [{"type": "text", "text": placeholder}, {"type": "text", "text": "What colour?"}]}
    [out] = apply_task_prompts([message], prompt="Look closely. {}", system_prompt=None)
    assert out["content"][0]["text"] is placeholder
    assert out["content"][1]["text"] == "Look closely. What colour?"
    with pytest.raises(ValueError, match="the first user turn\\) has no text for the task prompt"):
        apply_task_prompts([{"role": "user", "content": [{"type": "text", "text": placeholder}]}], prompt="{}",
                           system_prompt=None)


def test_prompts_reach_the_tokens_and_the_fingerprint(tokenizer, tmp_path):
    (tmp_path / "prompt.txt").write_text("Question: {}", encoding="utf-8")
    config = validate_data_config({"energon": {}, "prompt_file": str(tmp_path / "prompt.txt"), "system_prompt": "Be brief."})
    assert (config.prompt, config.system_prompt) == ("Question: {}", "Be brief.")
    adapter = ProcessorAdapter.from_processor(tokenizer, config.adapter_flags(), 256)
    plain = ProcessorAdapter.from_processor(tokenizer, {}, 256)
    log = adapter.format([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    text = "".join(tokenizer.decode(m["token_ids"]) for m in log)
    assert "Be brief." in text and "Question: hi" in text and [m["role"] for m in log] == ["system", "user", "assistant"]
    assert adapter.fingerprint != plain.fingerprint
    assert set(adapter.identity_summary) - set(plain.identity_summary) == {"prompt_sha256", "system_prompt_sha256"}
    assert plain.fingerprint == ProcessorAdapter(tokenizer=tokenizer, max_sequence_length=256).fingerprint


@pytest.mark.parametrize(("prompt", "message"), [
    ("Solve: {x}", "cannot be formatted with the user text (KeyError: 'x')"),
    ("Solve this.", "has no '{}' placeholder, so the user text would be lost"),
])
def test_a_prompt_that_cannot_take_the_user_text_is_refused(prompt, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_data_config({"energon": {}, "prompt": prompt})


def test_a_changed_prompt_is_refused_on_restore_with_a_diff_line(energon_dataset, tokenizer):
    def build(prompt):
        return build_energon_sft_loader(
            data_config={"energon": {}, "shuffle": True, "prompt": prompt},
            source={"path": energon_dataset.path, "split": "train"},
            processor=tokenizer, batch_size=2, max_sequence_length=256, split_role="train", **SINGLE_RANK_UNPACKED,
        )

    saved = build("Reply kindly: {}")
    next(iter(saved))
    state = saved.state_dict()
    saved.close()
    with pytest.raises(ValueError) as error:
        build("Reply briefly: {}").load_state_dict(state)
    assert str(error.value).startswith("Energon loader identity changed: adapter.prompt_sha256 '")
    with pytest.raises(ValueError, match=r"adapter.prompt_sha256 removed '"):
        build(None).load_state_dict(state)
    build("Reply kindly: {}").load_state_dict(state)  # the same prompt restores


def test_validate_sample_rejects_an_unknown_kind_as_an_adapter_error():
    with pytest.raises(RowRejected) as error:
        validate_sample({"kind": "qa", "messages": []})
    assert error.value.reason == "adapter_error"


def test_a_loader_spec_refuses_bad_packing_options_on_the_driver():
    """Each mistake fails where the spec is written, naming the fix; no actor or loader is built."""
    base = dict(data_config={"energon": {"packing_buffer_size": 8}, "shuffle": True},
                source={"path": "/d", "split": "train"}, batch_size=2, max_sequence_length=64)
    cases = [
        (dict(packing_algorithm="best_fit"), r"unknown packing algorithm 'best_fit'; expected one of: concatenative"),
        (dict(data_config={"energon": {}, "shuffle": True}, packing_algorithm="first_fit_decreasing"),
         r"packing_algorithm is 'first_fit_decreasing' but packing_buffer_size is not set"),
        ({}, r"packing_buffer_size is 8 but packing_algorithm is None"),
        (dict(data_config={"energon": {"task": "preference", "packing_buffer_size": 8}, "shuffle": True},
              packing_algorithm="first_fit_decreasing"), r"task 'preference' does not pack its samples"),
        (dict(data_config={"energon": {}, "shuffle": True}, max_sequences_per_bin=4),
         r"max_sequences_per_bin is 4 but packing is off"),
        (dict(packing_algorithm="FIRST_FIT_DECREASING", sequence_length_pad_multiple=5),
         r"max_sequence_length 64 is not a multiple of sequence_length_pad_multiple 5"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            LoaderSpec(**{**base, **overrides})
    spec = LoaderSpec(**{**base, "packing_algorithm": "First_Fit_Decreasing"})
    assert spec.packing_algorithm == "first_fit_decreasing" and spec.task().name == "chat_sft"


def test_the_former_task_key_is_read_with_a_warning_and_the_same_identity(energon_dataset, tokenizer):
    from rl_data.energon.config import EnergonLoaderConfig
    from rl_data.energon.sft_dataloader import build_loader

    with pytest.warns(FutureWarning, match=r"data_config\['energon'\]\['task_encoder'\] is deprecated: name the task with data_config\['energon'\]\['task'\]"):
        old = EnergonLoaderConfig(task_encoder="rl_prompt")
    assert old == EnergonLoaderConfig(task="rl_prompt") and old.identity_dump()["task_encoder"] == "rl_prompt"
    with pytest.raises(ValueError, match=r"has both 'task' and 'task_encoder' \(its former name\); keep 'task'"):
        EnergonLoaderConfig(task="rl_prompt", task_encoder="chat_sft")
    source = {"path": energon_dataset.path, "split": "train", "virtual_epoch_length": 5}
    identities = []
    for key in ("task", "task_encoder"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            spec = LoaderSpec(data_config={"energon": {key: "chat_sft"}, "shuffle": True}, source=source, batch_size=2,
                              max_sequence_length=256)
        loader = build_loader(spec, tokenizer, logical_rank=0, logical_world_size=1, placement_fingerprint="f" * 64)
        identities.append(loader.identity)
        loader.close()
    assert identities[0] == identities[1] and identities[0]["loader"]["task_encoder"] == "chat_sft"
