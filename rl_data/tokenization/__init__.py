"""Offline Qwen3 tokenizer, chat formatting -> message_log, loss masks, truncation, flat batches."""

from rl_data.tokenization.chat import (
    FormattingPath,
    apply_task_data_spec,
    formatting_path,
    get_formatted_message_log,
    get_formatted_message_log_reference,
    get_truncated_formatted_message_log,
)
from rl_data.tokenization.chat_template import CHATML_TEMPLATE
from rl_data.tokenization.flatten import (
    batched_message_log_to_flat_message,
    message_log_to_flat_messages,
    sft_batch_tensors,
)
from rl_data.tokenization.loss_mask import add_loss_mask_to_message_log
from rl_data.tokenization.templates import TEMPLATE_FAMILIES, tokenizer_with_template
from rl_data.tokenization.tokenizer import build_qwen3_tokenizer, load_qwen3_tokenizer
from rl_data.tokenization.truncation import message_log_length, truncate_message_log
from rl_data.tokenization.validation import validate_messages

__all__ = [
    "CHATML_TEMPLATE",
    "TEMPLATE_FAMILIES",
    "FormattingPath",
    "add_loss_mask_to_message_log",
    "apply_task_data_spec",
    "batched_message_log_to_flat_message",
    "formatting_path",
    "build_qwen3_tokenizer",
    "get_formatted_message_log",
    "get_formatted_message_log_reference",
    "get_truncated_formatted_message_log",
    "load_qwen3_tokenizer",
    "message_log_length",
    "message_log_to_flat_messages",
    "sft_batch_tensors",
    "tokenizer_with_template",
    "truncate_message_log",
    "validate_messages",
]
