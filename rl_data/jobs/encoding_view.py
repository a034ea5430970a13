"""Readable view of encoded conversations: message_log, loss masks and the flattened SFT batch.

Encodes real chitchat conversations (plus one with a system prompt, one with a tool call and
one over-length conversation that shows the truncation rule: 4 tokens kept per message, loss
multiplier 0) and renders, per message, its role, token count, whether it is trained, and the
decoded text with trained tokens highlighted; then the padded SFT batch the trainer receives.
Used by ``rl-data show-conversations`` and, shortened, at the start of the main job.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rl_data.sample_data import chitchat_conversations
from rl_data.tokenization.chat import get_formatted_message_log
from rl_data.tokenization.flatten import sft_batch_tensors
from rl_data.tokenization.loss_mask import add_loss_mask_to_message_log
from rl_data.tokenization.truncation import truncate_message_log

TRAINED_STYLE = "bold green"
MASKED_STYLE = "grey50"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def demo_conversations(num_conversations: int, max_turns: int) -> list[dict[str, Any]]:
    """Real chitchat conversations (cut to ``max_turns``), a system-prompt one, a tool call, a long one."""
    real = list(chitchat_conversations(limit=num_conversations))
    samples = [
        {"name": f"chitchat {c['id']} (first {max_turns} turns)", "messages": c["messages"][:max_turns]}
        for c in real
    ]
    samples.append({
        "name": "system prompt, multilingual",
        "messages": [
            {"role": "system", "content": "You are a concise, friendly assistant."},
            {"role": "user", "content": "How do you say 'good morning' in Japanese and Hindi? 🌅"},
            {"role": "assistant", "content": "Japanese: おはようございます. Hindi: सुप्रभात."},
        ],
    })
    samples.append({
        "name": "tool call",
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "user", "content": "Is it warm in Paris right now?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 24, "sky": "clear"}'},
            {"role": "assistant", "content": "Yes: 24 °C and clear skies in Paris."},
        ],
    })
    long_one = real[0]
    samples.append({"name": f"chitchat {long_one['id']} (all {len(long_one['messages'])} turns)", "messages": long_one["messages"]})
    return samples


def encode_sample(sample: dict[str, Any], tokenizer, max_seq_length: int) -> dict[str, Any]:
    """Template + tokenize, mask non-assistant tokens, apply the over-length rule."""
    message_log = get_formatted_message_log(sample["messages"], tokenizer, tools=sample.get("tools"))
    add_loss_mask_to_message_log([message_log], roles_to_train_on=("assistant",))
    full_length = sum(len(m["token_ids"]) for m in message_log)
    message_log, length, loss_multiplier = truncate_message_log(message_log, max_seq_length)
    return {
        "name": sample["name"],
        "message_log": message_log,
        "full_length": full_length,
        "length": length,
        "loss_multiplier": loss_multiplier,
    }


def highlighted_text(message: dict[str, Any], tokenizer, loss_multiplier: float) -> Text:
    """Decoded tokens, each run of trained tokens highlighted and masked ones dimmed."""
    text = Text()
    ids = message["token_ids"].tolist()
    mask = (message["token_loss_mask"] * (loss_multiplier != 0)).tolist()
    start = 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or mask[end] != mask[start]:
            style = TRAINED_STYLE if mask[start] else MASKED_STYLE
            text.append(tokenizer.decode(ids[start:end]), style=style)
            start = end
    return text


def message_log_table(encoded: dict[str, Any], tokenizer, max_rows: int) -> Table:
    status = "TRUNCATED (loss multiplier 0)" if encoded["loss_multiplier"] == 0 else "loss multiplier 1"
    table = Table(
        title=f"{encoded['name']}: {encoded['full_length']} tokens -> {encoded['length']}, {status}",
        title_justify="left",
        show_lines=True,
    )
    for column, justify in (("#", "right"), ("role", "left"), ("tokens", "right"), ("loss", "left"), ("decoded text", "left")):
        table.add_column(column, justify=justify, overflow="fold")
    log = encoded["message_log"]
    for index, message in enumerate(log[:max_rows]):
        trained = bool(message["token_loss_mask"].any()) and encoded["loss_multiplier"] != 0
        table.add_row(
            str(index),
            message["role"],
            str(len(message["token_ids"])),
            Text("trained", style=TRAINED_STYLE) if trained else Text("masked", style=MASKED_STYLE),
            highlighted_text(message, tokenizer, encoded["loss_multiplier"]),
        )
    if len(log) > max_rows:
        table.add_row("…", "", "", "", f"{len(log) - max_rows} more messages")
    return table


def batch_summary_table(encoded: list[dict[str, Any]], tokenizer, multiple: int) -> Table:
    batch = sft_batch_tensors(
        [e["message_log"] for e in encoded],
        [e["loss_multiplier"] for e in encoded],
        pad_token_id=tokenizer.pad_token_id,
        make_sequence_length_divisible_by=multiple,
    )
    input_ids, lengths, token_mask = batch["input_ids"], batch["input_lengths"], batch["token_mask"]
    real_tokens = int(lengths.sum())
    table = Table(title="Flattened SFT batch", title_justify="left")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    for key, value in batch.items():
        table.add_row(f"{key}", f"shape {tuple(value.shape)}, {value.dtype}")
    table.add_row("input_lengths values", str(lengths.tolist()))
    table.add_row("sample_mask values", str(batch["sample_mask"].tolist()))
    table.add_row("padding", f"{input_ids.numel() - real_tokens} of {input_ids.numel()} slots "
                  f"(length rounded up to a multiple of {multiple}, pad id {tokenizer.pad_token_id})")
    trained = int(token_mask.sum())
    table.add_row("trained tokens", f"{trained} of {real_tokens} real tokens "
                  f"({100 * (1 - trained / real_tokens):.1f}% masked)")
    return table


def show_conversations(
    console: Console,
    tokenizer: Any,
    *,
    num_conversations: int = 3,
    max_turns: int = 4,
    max_seq_length: int = 512,
    sequence_length_multiple: int = 8,
    max_rows: int = 8,
    examples: bool = True,
) -> list[dict[str, Any]]:
    """Print the message-log table of each conversation, then the batch table; return the encodings.

    ``examples=False`` shows only the real chitchat conversations (no system prompt, tool call
    or over-length example).
    """
    samples = demo_conversations(num_conversations, max_turns)
    if not examples:
        samples = samples[:num_conversations]
    encoded = [encode_sample(s, tokenizer, max_seq_length) for s in samples]
    for sample in encoded:
        console.print(message_log_table(sample, tokenizer, max_rows))
    console.print(batch_summary_table(encoded, tokenizer, sequence_length_multiple))
    console.print(f"[{TRAINED_STYLE}]trained[/] / [{MASKED_STYLE}]masked[/] tokens")
    return encoded
