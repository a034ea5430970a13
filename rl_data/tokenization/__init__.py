"""Offline Qwen3 tokenizer, chat formatting -> message_log, loss masks, truncation, flat batches."""

from rl_data._moved import moved_names as _moved_names

# Former re-exports (see rl_data/_moved.py).
__getattr__ = _moved_names(
    __name__,
    {
        "CHATML_TEMPLATE": "rl_data.tokenization.chat_template",
        "FormattingPath": "rl_data.tokenization.chat",
        "TEMPLATE_FAMILIES": "rl_data.tokenization.templates",
        "add_loss_mask_to_message_log": "rl_data.tokenization.loss_mask",
        "apply_task_data_spec": "rl_data.tokenization.chat",
        "batched_message_log_to_flat_message": "rl_data.tokenization.flatten",
        "build_qwen3_tokenizer": "rl_data",
        "formatting_path": "rl_data",
        "get_formatted_message_log": "rl_data",
        "get_formatted_message_log_reference": "rl_data.tokenization.chat",
        "get_truncated_formatted_message_log": "rl_data.tokenization.chat",
        "load_qwen3_tokenizer": "rl_data",
        "message_log_length": "rl_data.tokenization.truncation",
        "message_log_to_flat_messages": "rl_data.tokenization.flatten",
        "sft_batch_tensors": "rl_data.tokenization.flatten",
        "tokenizer_with_template": "rl_data",
        "truncate_message_log": "rl_data.tokenization.truncation",
        "validate_messages": "rl_data.tokenization.validation",
    },
)
