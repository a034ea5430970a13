"""The processor adapter: a tokenizer plus the formatting flags that decide the token ids.

Everything that changes how a conversation becomes tokens is pinned by
:attr:`ProcessorAdapter.fingerprint` (tokenizer name and vocabulary hash, chat template, maximum
sequence length, BOS/EOS/generation-prompt flags), so a loader restored with another
tokenizer or template is refused instead of silently producing other ids.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from rl_data.interfaces import LLMMessageLogType, TaskDataSpec
from rl_data.tokenization.chat import get_formatted_message_log, get_truncated_formatted_message_log
from rl_data.tokenization.validation import CONTROL_TEXT_POLICIES
from rl_data.tokenization.vocab_fingerprint import vocab_fingerprint


def _template_digest(template: Any) -> str | None:
    """sha256 hex of a chat template's text (of its canonical JSON when it is not one string)."""
    if template is None:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ProcessorAdapter:
    """Formats canonical chat messages into a ``message_log`` with ``token_ids`` per message."""

    tokenizer: Any = field(repr=False)
    max_sequence_length: int
    add_bos: bool = True
    add_eos: bool = True
    add_generation_prompt: bool = False
    #: what to do with the tokenizer's special tokens inside message text (docs: tasks and tokenizers,
    #: "Control text policy"): ``"reject"`` the sample, or encode it as ``"plain_text"``
    control_text: str = "reject"
    #: ``TaskDataSpec.prompt``: the first user turn's text becomes ``prompt.format(text)``
    prompt: str | None = None
    #: ``TaskDataSpec.system_prompt``: inserted first when the conversation has no system turn
    system_prompt: str | None = None

    def __post_init__(self) -> None:
        if self.max_sequence_length < 1:
            raise ValueError(
                f"max_sequence_length must be >= 1, got {self.max_sequence_length}"
            )
        if self.control_text not in CONTROL_TEXT_POLICIES:
            raise ValueError(
                f"control_text must be one of {list(CONTROL_TEXT_POLICIES)}, got {self.control_text!r}"
            )

    @classmethod
    def from_processor(
        cls, processor: Any, data_config: Mapping[str, Any], max_sequence_length: int
    ) -> "ProcessorAdapter":
        """Build from a tokenizer or a processor (its ``.tokenizer`` is used) and the data config.

        ``add_bos``, ``add_eos``, ``add_generation_prompt``, ``control_text``, ``prompt`` and
        ``system_prompt`` come from ``data_config`` (defaults True, True, False, ``"reject"``,
        None, None).
        """
        if processor is None:
            raise ValueError("processor is None: pass a tokenizer or a processor with .tokenizer")
        return cls(
            tokenizer=getattr(processor, "tokenizer", processor),
            max_sequence_length=max_sequence_length,
            add_bos=bool(data_config.get("add_bos", True)),
            add_eos=bool(data_config.get("add_eos", True)),
            add_generation_prompt=bool(data_config.get("add_generation_prompt", False)),
            control_text=str(data_config.get("control_text", "reject")),
            prompt=data_config.get("prompt"),
            system_prompt=data_config.get("system_prompt"),
        )

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's pad id (its EOS id when it has no pad token)."""
        pad = self.tokenizer.pad_token_id
        pad = self.tokenizer.eos_token_id if pad is None else pad
        if pad is None:
            raise ValueError(
                f"tokenizer {self.tokenizer.name_or_path!r} has neither a pad nor an EOS token; "
                "set tokenizer.pad_token before packing"
            )
        return int(pad)

    @cached_property
    def identity(self) -> dict[str, Any]:
        """The plain-JSON description hashed into :attr:`fingerprint`.

        ``control_text``, ``prompt`` and ``system_prompt`` are listed only when they are not the
        defaults, so fingerprints of loaders that never set them stay what they were.
        """
        identity = {
            "tokenizer": os.path.basename(str(self.tokenizer.name_or_path).rstrip("/")),
            "vocab_size": len(self.tokenizer),
            "vocab_sha256": vocab_fingerprint(self.tokenizer),
            "chat_template": self.tokenizer.chat_template,
            "max_sequence_length": self.max_sequence_length,
            "add_bos": self.add_bos,
            "add_eos": self.add_eos,
            "add_generation_prompt": self.add_generation_prompt,
        }
        if self.control_text != "reject":
            identity["control_text"] = self.control_text
        for name in ("prompt", "system_prompt"):
            if getattr(self, name) is not None:
                identity[name] = getattr(self, name)
        return identity

    @cached_property
    def fingerprint(self) -> str:
        """sha256 hex of the canonical JSON of :attr:`identity`."""
        canonical = json.dumps(self.identity, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()

    @cached_property
    def identity_summary(self) -> dict[str, Any]:
        """:attr:`identity` with the chat template replaced by its sha256, plus the fingerprint.

        This is what a loader identity records, so a refusal names the field that changed
        (``adapter.max_sequence_length 1024 -> 2048``) without carrying the template text.
        """
        summary = {k: v for k, v in self.identity.items() if k not in ("chat_template", "prompt", "system_prompt")}
        summary["chat_template_sha256"] = _template_digest(self.identity["chat_template"])
        for name in ("prompt", "system_prompt"):
            if name in self.identity:
                summary[f"{name}_sha256"] = _template_digest(self.identity[name])
        summary["fingerprint"] = self.fingerprint
        return summary

    @cached_property
    def task_data_spec(self) -> TaskDataSpec | None:
        """``prompt`` and ``system_prompt`` as the ``TaskDataSpec`` the formatting applies (None: neither)."""
        if self.prompt is None and self.system_prompt is None:
            return None
        spec = TaskDataSpec()
        spec.prompt, spec.system_prompt = self.prompt, self.system_prompt
        return spec

    def format(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None
    ) -> LLMMessageLogType:
        """Apply the task prompts, then tokenise through the chat template into a ``message_log``."""
        return get_formatted_message_log(list(messages), self.tokenizer, self.task_data_spec, **self._options(tools))

    def format_truncated(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, max_sequence_length: int
    ) -> tuple[LLMMessageLogType, int, float]:
        """:meth:`format`, then the truncation rule: ``(message_log, length, loss_multiplier)``; an
        over-long conversation is encoded only as far as its stubs need."""
        return get_truncated_formatted_message_log(
            list(messages), self.tokenizer, max_sequence_length, self.task_data_spec, **self._options(tools)
        )

    def _options(self, tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
        return {
            "add_bos_token": self.add_bos,
            "add_eos_token": self.add_eos,
            "add_generation_prompt": self.add_generation_prompt,
            "tools": list(tools) if tools else None,
            "control_text": self.control_text,
        }
