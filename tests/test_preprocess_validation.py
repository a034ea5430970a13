"""Row validation: each reason code for the row that breaks its rule, and good rows pass."""

from __future__ import annotations

import pytest

from rl_data.preprocess.validation import REASONS, RowRejected, parse_row, validate_sample

USER = {"role": "user", "content": "How do I boil an egg?"}
ASSISTANT = {"role": "assistant", "content": "Simmer it for nine minutes."}


def sft(*messages):
    return {"kind": "sft", "messages": list(messages)}


@pytest.mark.parametrize(
    ("sample", "reason", "message"),
    [
        (sft(), "missing_field", "messages must be a non-empty list, found []"),
        ({"kind": "sft", "messages": "hi"}, "missing_field", "messages must be a non-empty list, found 'hi'"),
        (sft(USER, {"role": "robot", "content": "beep"}), "invalid_role",
         "message 1: role 'robot' is not one of ['system', 'user', 'assistant', 'tool']"),
        (sft({"content": "no role"}, ASSISTANT), "invalid_role",
         "message 0: role None is not one of ['system', 'user', 'assistant', 'tool']"),
        (sft(USER, {"role": "assistant", "content": 42}), "non_text_content",
         "message 1 (assistant): content must be text, found 42"),
        (sft({"role": "user", "content": [{"type": "image", "image": "cat.png"}]}, ASSISTANT), "non_text_content",
         "message 0 (user): content must be text, found [{'type': 'image', 'image': 'cat.png'}]"),
        (sft(USER, {"role": "assistant", "content": "  \n"}), "empty_content", "message 1 (assistant): content is empty"),
        (sft({"role": "system", "content": "Be kind."}, USER), "no_assistant_turn",
         "conversation has no assistant turn (roles ['system', 'user'])"),
        (sft(USER, ASSISTANT, {"role": "tool", "content": "42"}), "invalid_message",
         "message 2 (tool): no earlier assistant message made a tool call; expected a tool message to answer "
         "an earlier assistant 'tool_calls' entry"),
        ({"kind": "preference", "context": [USER], "chosen": [ASSISTANT], "rejected": [ASSISTANT]},
         "identical_preference", "chosen and rejected are identical"),
        ({"kind": "preference", "context": [USER], "chosen": [ASSISTANT], "rejected": []}, "missing_field",
         "preference 'rejected' must be a non-empty list of messages"),
        ({"kind": "preference", "context": [USER], "chosen": [ASSISTANT], "rejected": [{"role": "user", "content": "?"}]},
         "no_assistant_turn", "rejected: conversation has no assistant turn (roles ['user', 'user'])"),
    ],
)
def test_rejections_name_the_reason_and_place(sample, reason, message):
    with pytest.raises(RowRejected) as error:
        validate_sample(sample)
    assert (error.value.reason, error.value.message) == (reason, message)


def test_good_rows_pass(chat_conversations):
    for conversation in chat_conversations[:200]:
        validate_sample(sft(*conversation["messages"]))
    validate_sample(sft(USER, {"role": "assistant", "content": [{"type": "text", "text": "Nine minutes."}]}))
    validate_sample({"kind": "preference", "context": [USER], "chosen": [ASSISTANT],
                     "rejected": [{"role": "assistant", "content": "Microwave it."}]})


@pytest.mark.parametrize(
    ("raw", "message"),
    [("{bad", "row is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"),
     ("[1, 2]", "row must be a JSON object, found list")],
)
def test_parse_row_rejects_non_objects(raw, message):
    with pytest.raises(RowRejected) as error:
        parse_row(raw)
    assert (error.value.reason, error.value.message) == ("invalid_json", message)


def test_unknown_reason_code_is_a_programming_error():
    with pytest.raises(ValueError, match="unknown rejection reason 'oops'"):
        RowRejected("oops", "x")
    assert set(REASONS) >= {"invalid_json", "too_long", "adapter_error"}
