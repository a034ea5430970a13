"""Schema adapters on realistic rows, auto-detection and user adapters by import path."""

from __future__ import annotations

import pytest
from preprocess_fixtures import GSM8K_ROW

from rl_data.preprocess.adapters import ADAPTERS, detect_adapter, resolve_adapter
from rl_data.preprocess.validation import RowRejected, validate_sample


def test_openai_messages_keeps_messages_and_tools(chat_conversations):
    messages = chat_conversations[0]["messages"]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    sample = resolve_adapter("openai")({"messages": messages, "tools": tools, "id": "x"})
    assert sample == {"kind": "sft", "messages": messages, "tools": tools}
    validate_sample(sample)


def test_sharegpt_maps_human_gpt_and_system():
    row = {
        "id": "identity_0",
        "system": "You are helpful.",
        "conversations": [
            {"from": "human", "value": "Who are you?"},
            {"from": "gpt", "value": "I am Vicuna, a language model."},
            {"from": "user", "value": "Thanks!"},
            {"from": "assistant", "value": "You're welcome."},
        ],
    }
    assert resolve_adapter("sharegpt")(row)["messages"] == [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Who are you?"},
        {"role": "assistant", "content": "I am Vicuna, a language model."},
        {"role": "user", "content": "Thanks!"},
        {"role": "assistant", "content": "You're welcome."},
    ]


def test_sharegpt_unknown_speaker_is_invalid_role():
    with pytest.raises(RowRejected) as error:
        resolve_adapter("sharegpt")({"conversations": [{"from": "bot", "value": "hi"}]})
    assert error.value.reason == "invalid_role"
    assert str(error.value).startswith("conversations[0]: unknown speaker 'bot'; expected one of ['assistant', ")


def test_alpaca_joins_instruction_and_input():
    alpaca = resolve_adapter("alpaca")
    with_input = {"instruction": "Identify the odd one out.", "input": "Twitter, Instagram, Telegram",
                  "output": "Telegram"}
    assert alpaca(with_input)["messages"] == [
        {"role": "user", "content": "Identify the odd one out.\n\nTwitter, Instagram, Telegram"},
        {"role": "assistant", "content": "Telegram"},
    ]
    no_input = {"instruction": "Give three tips for staying healthy.", "input": "", "output": "1. Eat well."}
    assert alpaca(no_input)["messages"][0] == {"role": "user", "content": "Give three tips for staying healthy."}


def test_prompt_response_and_gsm8k_keep_the_final_answer_line():
    adapt = resolve_adapter("prompt_response")
    sample = adapt(GSM8K_ROW)
    assert sample["messages"][0] == {"role": "user", "content": GSM8K_ROW["question"]}
    assert sample["messages"][1]["content"] == GSM8K_ROW["answer"]
    assert sample["messages"][1]["content"].splitlines()[-1] == "#### 72"
    assert adapt({"prompt": "2+2?", "response": "4", "system": "Be brief."})["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"}]


def test_preference_pairs_stay_preference_samples():
    row = {"prompt": "What is the capital of France?", "chosen": "Paris.", "rejected": "Lyon."}
    assert resolve_adapter("preference")(row) == {
        "kind": "preference",
        "context": [{"role": "user", "content": "What is the capital of France?"}],
        "chosen": [{"role": "assistant", "content": "Paris."}],
        "rejected": [{"role": "assistant", "content": "Lyon."}],
    }
    prompt = [{"role": "user", "content": "Hi"}]
    full = {"prompt": prompt, "chosen": prompt + [{"role": "assistant", "content": "Hello!"}],
            "rejected": prompt + [{"role": "assistant", "content": "Go away."}]}
    sample = resolve_adapter("preference")(full)
    assert sample["chosen"] == [{"role": "assistant", "content": "Hello!"}]
    assert sample["rejected"] == [{"role": "assistant", "content": "Go away."}]
    validate_sample(sample)


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"messages": []}, "openai"),
        ({"conversations": []}, "sharegpt"),
        ({"instruction": "", "input": "", "output": ""}, "alpaca"),
        (GSM8K_ROW, "prompt_response"),
        ({"prompt": "", "response": ""}, "prompt_response"),
        ({"prompt": "", "chosen": "", "rejected": ""}, "preference"),
    ],
)
def test_detection_by_keys(row, expected):
    assert detect_adapter([row, row]) == expected


def test_detection_picks_the_majority_schema_over_bad_rows():
    assert detect_adapter([{"messages": []}, {"messages": []}, {"conversations": []}, {"text": "x"}]) == "openai"


def test_ambiguous_schema_names_the_candidates():
    row = {"prompt": "p", "response": "r", "chosen": "c", "rejected": "x"}
    with pytest.raises(ValueError) as error:
        detect_adapter([row])
    assert str(error.value) == (
        "ambiguous input schema: 1 of 1 sampled rows match each of ['preference', 'prompt_response'] "
        "(keys found: ['chosen', 'prompt', 'rejected', 'response']); pass --adapter with one of "
        "['preference', 'prompt_response']"
    )


def test_no_matching_schema_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"^no adapter matches the input rows \(keys found: \['text'\]\); "
                                         r"known schemas: openai: \['messages'\]; sharegpt"):
        detect_adapter([{"text": "hello"}])


def test_user_adapter_by_import_path():
    adapt = resolve_adapter("preprocess_fixtures:title_case_adapter")
    assert adapt({"q": "name a color", "a": "deep blue"})["messages"][1] == {"role": "assistant", "content": "Deep Blue"}
    assert "preprocess_fixtures:title_case_adapter" not in ADAPTERS


@pytest.mark.parametrize(
    ("name", "message"),
    [
        # the built-in adapters and the built-in tasks' (plus those of tasks registered earlier in the session)
        ("nope", "unknown adapter 'nope'; expected one of ['alpaca', 'env_info', 'gsm8k', 'openai', 'preference', "
                 "'prompt_ground_truth', 'prompt_response', 'rl_messages', 'sharegpt'"),
        ("no_such_module_xyz:f", "cannot import adapter 'no_such_module_xyz:f': No module named 'no_such_module_xyz'"),
        ("preprocess_fixtures:GSM8K_ROW", "adapter 'preprocess_fixtures:GSM8K_ROW' is a dict, not a callable"),
    ],
)
def test_bad_adapter_names(name, message):
    with pytest.raises(ValueError) as error:
        resolve_adapter(name)
    assert str(error.value).startswith(message)
