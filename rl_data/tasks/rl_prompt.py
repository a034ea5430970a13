"""``rl_prompt``: prompts with what an RL environment needs to score the model's answer.

Stored kind ``"rl_prompt"``: ``{"kind": "rl_prompt", "messages": [system?, user, ...],
"extra_env_info": {...}, "task_name": str, "stop_strings"?: [str, ...], "source": {...}}``.
The messages end with the user's (or a tool's) turn: the model writes the answer.
``extra_env_info`` is a non-empty JSON object, e.g. ``{"ground_truth": "18"}``.

The loader yields NeMo-RL ``DatumSpec`` rows (:class:`RLPromptTaskEncoder`): the prompt
rendered with the generation prompt and without EOS (``adapter_overrides``), never truncated:
a prompt longer than ``max_sequence_length`` is filtered out and counted
(:func:`rl_data.energon.failure_budget.filter_sample`). Prompts are never packed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Optional

import torch
from megatron.energon import Sample, basic_sample_keys, edataclass, stateless
from pydantic import model_serializer

from rl_data.batch_stats import BatchStats
from rl_data.batched_data_dict import BatchedDataDict
from rl_data.energon.failure_budget import filter_sample
from rl_data.energon.sample_validation import RowRejected, validate_conversation
from rl_data.energon.task_encoders.base import BaseSFTTaskEncoder
from rl_data.energon.task_encoders.cookers import decode_record
from rl_data.task_contract import AdapterSpec, DemoData, SampleSchema, Task, TaskConfig
from rl_data.tokenization.chat import apply_task_data_spec

KIND = "rl_prompt"
#: ``task_name`` of rows that do not name one (NeMo-RL's math environment).
DEFAULT_TASK_NAME = "math"
#: Roles after which the chat template opens the assistant's turn.
_PROMPT_END_ROLES = ("user", "tool")

REASONS = {
    "no_ground_truth": "the row has no ground truth answer (GSM8K: no '#### <answer>' line) and no other "
    "environment info to score a response with",
    "ends_with_assistant": "the prompt's last turn is the assistant's; an RL prompt ends with the user's turn",
    "invalid_env_info": "extra_env_info is not a JSON object, or ground_truth is not text or a number",
    "invalid_stop_strings": "stop_strings is not a list of non-empty strings",
}


# -- stored sample ---------------------------------------------------------------------------


def validate_prompt(sample: Mapping[str, Any], media: bool = False) -> None:
    """Raise ``RowRejected`` for the first problem of an ``rl_prompt`` sample."""
    messages = sample.get("messages")
    validate_conversation(messages, media=media, require_assistant=False)
    last = messages[-1]["role"]
    if last == "assistant":
        raise RowRejected("ends_with_assistant", (
            f"the last of {len(messages)} messages is the assistant's; remove the answer from the prompt "
            "(keep it in extra_env_info, e.g. as ground_truth)"))
    if last not in _PROMPT_END_ROLES:
        raise RowRejected("missing_field", f"the prompt ends with a {last!r} turn; add the user's turn after it")
    env = sample.get("extra_env_info")
    if not isinstance(env, dict):
        raise RowRejected("invalid_env_info", f"extra_env_info must be a JSON object, found {_brief(env)}")
    if not env:
        raise RowRejected("no_ground_truth", "extra_env_info is empty; give at least a ground_truth")
    task_name = sample.get("task_name")
    if not isinstance(task_name, str) or not task_name.strip():
        raise RowRejected("missing_field", f"task_name must be a non-empty string, found {_brief(task_name)}")
    _check_stop_strings(sample.get("stop_strings"))


def _check_stop_strings(value: Any) -> None:
    if value is not None and not (isinstance(value, list) and all(isinstance(s, str) and s for s in value)):
        raise RowRejected("invalid_stop_strings", f"stop_strings must be a list of non-empty strings, found {_brief(value)}")


def _brief(value: Any) -> str:
    text = f"{type(value).__name__} {value!r}"
    return text if len(text) <= 80 else text[:77] + "..."


# -- preprocess adapters ---------------------------------------------------------------------


def _rl_sample(row: Mapping[str, Any], messages: list[Any], env: dict[str, Any]) -> dict[str, Any]:
    """The ``rl_prompt`` sample of ``messages`` with the row's optional columns.

    ``system`` becomes a leading system turn, ``ground_truth`` joins ``env`` (as text),
    ``task_name`` defaults to :data:`DEFAULT_TASK_NAME`, ``stop_strings`` is kept when set.
    """
    if row.get("system") and not (messages and isinstance(messages[0], Mapping) and messages[0].get("role") == "system"):
        messages = [{"role": "system", "content": row["system"]}] + messages
    truth = row.get("ground_truth")
    if truth is not None:
        if isinstance(truth, bool) or not isinstance(truth, (str, int, float)):
            raise RowRejected("invalid_env_info", f"ground_truth must be text or a number, found {_brief(truth)}")
        truth = str(truth).strip()
        if truth and env.get("ground_truth", truth) != truth:
            raise RowRejected("invalid_env_info", (
                f"ground_truth {truth!r} differs from extra_env_info.ground_truth {env['ground_truth']!r}; keep one"))
        if truth:
            env = {**env, "ground_truth": truth}
    if not env:
        raise RowRejected("no_ground_truth", f"the row has no ground_truth and no extra_env_info (keys: {sorted(row)})")
    sample = {"kind": KIND, "messages": messages, "extra_env_info": env, "task_name": row.get("task_name") or DEFAULT_TASK_NAME}
    if row.get("stop_strings") is not None:
        _check_stop_strings(row["stop_strings"])
        sample["stop_strings"] = row["stop_strings"]
    return sample


def _prompt_messages(row: Mapping[str, Any]) -> list[Any]:
    """``messages`` (a list), else ``prompt``: a string (one user turn) or a message list."""
    value = row["messages"] if "messages" in row else row.get("prompt")
    if isinstance(value, str) and "messages" not in row:
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise RowRejected("missing_field", f"the prompt must be a message list (or 'prompt' text), found {_brief(value)}")
    return list(value)


def _env_column(row: Mapping[str, Any]) -> dict[str, Any]:
    env = row.get("extra_env_info")
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise RowRejected("invalid_env_info", f"extra_env_info must be a JSON object, found {_brief(env)}")
    return dict(env)


def gsm8k(row: dict[str, Any]) -> dict[str, Any]:
    """GSM8K ``{"question", "answer": "...#### 18"}``: the question is the prompt, the value after
    the last ``####`` the ground truth; the worked answer stays out of the prompt."""
    from rl_data.rewards import ground_truth_from_gsm8k_answer  # Math-Verify: only where rows are adapted

    question, answer = row.get("question"), row.get("answer")
    if not isinstance(question, str) or not isinstance(answer, str):
        raise RowRejected("missing_field", f"a GSM8K row needs text 'question' and 'answer' (keys: {sorted(row)})")
    truth = ground_truth_from_gsm8k_answer(answer)
    if truth is None:
        raise RowRejected("no_ground_truth", f"the answer has no '#### <final answer>' line: {answer[-60:]!r}")
    return _rl_sample(row, [{"role": "user", "content": question}], {"ground_truth": truth})


def prompt_ground_truth(row: dict[str, Any]) -> dict[str, Any]:
    """``{"prompt": text or messages, "ground_truth": text or number}``."""
    return _rl_sample(row, _prompt_messages(row), _env_column(row))


def rl_messages(row: dict[str, Any]) -> dict[str, Any]:
    """OpenAI ``{"messages": [...]}`` ending with the user's turn, plus ``ground_truth`` and/or
    ``extra_env_info`` columns."""
    return _rl_sample(row, _prompt_messages(row), _env_column(row))


def env_info(row: dict[str, Any]) -> dict[str, Any]:
    """An explicit ``extra_env_info`` object with a ``prompt`` (text or messages) or ``messages``."""
    if "extra_env_info" not in row:
        raise RowRejected("missing_field", f"row has no 'extra_env_info' object (keys: {sorted(row)})")
    return _rl_sample(row, _prompt_messages(row), _env_column(row))


# -- loader ----------------------------------------------------------------------------------


@edataclass
class RLPromptSample(Sample):
    """One stored RL prompt."""

    messages: list[dict[str, Any]]
    extra_env_info: dict[str, Any]
    task_name: str
    stop_strings: Optional[list[str]]
    source: dict[str, Any]


@edataclass
class EncodedRLPrompt(Sample):
    """One ``DatumSpec`` row (see :class:`RLPromptTaskEncoder`)."""

    message_log: list[dict[str, Any]]
    length: int
    extra_env_info: dict[str, Any]
    loss_multiplier: float
    idx: int
    task_name: str
    stop_strings: Optional[list[str]]
    messages: Optional[list[dict[str, Any]]]


class RLPromptCooker:
    """Cooks the ``json`` member of a crude ``rl_prompt`` sample into a :class:`RLPromptSample`."""

    #: Bump when the cooked output for the same input changes (part of the loader identity).
    COMPONENT_VERSION = 1

    @staticmethod
    @stateless
    def cook(raw: dict[str, Any]) -> RLPromptSample:
        """Decode and check with preprocess's rules (``ValueError``: the error handler skips it)."""
        key, record = decode_record(raw, KIND, reader="the RL prompt cooker")
        try:
            validate_prompt(record)
        except RowRejected as error:
            raise ValueError(f"sample {key!r}: {error.reason}: {error.message}") from None
        return RLPromptSample(
            **basic_sample_keys(raw),
            messages=record["messages"],
            extra_env_info=record["extra_env_info"],
            task_name=record["task_name"],
            stop_strings=record.get("stop_strings"),
            source=record.get("source") or {},
        )


class RLPromptConfig(TaskConfig):
    """``generation_padding``: batches also carry ``input_ids`` ``[B, max length]`` (the flattened
    message logs padded on that side with the pad token) and ``input_lengths`` ``[B]``; ``"none"``
    leaves them out.

    ``prompt_messages``: batches also carry ``messages``, each prompt as plain chat messages (role,
    text) after the task prompts (``system_prompt``, ``prompt``): what a trainer that applies the
    chat template itself (TRL) takes. Recorded in the loader identity only when on, so identities
    saved before the option existed still match.
    """

    generation_padding: Literal["left", "right", "none"] = "left"
    prompt_messages: bool = False

    @model_serializer(mode="wrap")
    def _identity_fields(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if not self.prompt_messages:
            data.pop("prompt_messages", None)
        return data


class RLPromptTaskEncoder(BaseSFTTaskEncoder):
    """RL prompts -> ``DatumSpec`` batches; packing is refused.

    Batch columns: ``message_log`` (lists), ``length`` (int64 ``[B]``), ``extra_env_info`` (dicts),
    ``loss_multiplier`` (float32 ``[B]``, all 1), ``idx`` (int64 ``[B]``), ``task_name``,
    ``stop_strings`` (lists or None), ``source_ids`` (sample keys), per ``generation_padding``
    ``input_ids`` / ``input_lengths``, and with ``prompt_messages`` the plain ``messages``.

    ``idx`` is the sample's index in its split: Energon's ``SourceInfo.index`` of the sample, its
    position in the split's shards (``.nv-meta/split.yaml`` order, per-shard counts from the
    shard index). It depends only on the prepared dataset, so it is the same across restores,
    worker counts and logical world sizes, and the indices of a split are ``range(split size)``.
    (``__restore_key__`` holds the same index behind wrapper-dependent prefixes.) In a blended
    metadataset each dataset counts from 0; ``source_ids`` tell them apart.
    """

    COMPONENT_VERSION = 1
    DEFAULT_COOKER = RLPromptCooker
    TENSOR_BATCHES = False

    def __init__(
        self, *, generation_padding: Literal["left", "right", "none"] = "left", prompt_messages: bool = False, **options: Any
    ) -> None:
        """``options``: those of :class:`BaseSFTTaskEncoder`, without packing. The adapter must
        add the generation prompt and no EOS (the task's ``adapter_overrides``)."""
        if options.get("packing_algorithm") is not None:
            raise ValueError(
                f"RL prompts are not packed (packing_algorithm={options['packing_algorithm']!r}); set "
                "packing_algorithm None and remove packing_buffer_size"
            )
        super().__init__(**options)
        if not self.adapter.add_generation_prompt or self.adapter.add_eos:
            raise ValueError(
                f"an RL prompt adapter needs add_generation_prompt True and add_eos False, found "
                f"{self.adapter.add_generation_prompt} and {self.adapter.add_eos}; apply the task's adapter_overrides"
            )
        if generation_padding not in ("left", "right", "none"):
            raise ValueError(f"generation_padding must be 'left', 'right' or 'none', got {generation_padding!r}")
        self.generation_padding = generation_padding
        self.prompt_messages = bool(prompt_messages)

    @stateless
    def encode_sample(self, sample: RLPromptSample) -> EncodedRLPrompt:
        """Render the prompt; a prompt over ``max_sequence_length`` tokens is filtered (counted)."""
        message_log = self.adapter.format(sample.messages)
        length = sum(int(m["token_ids"].numel()) for m in message_log)
        if length > self.max_sequence_length:
            filter_sample(sample, f"prompt of {length} tokens > max_sequence_length {self.max_sequence_length}")
        if not sample.__sources__:
            raise ValueError(f"sample {sample.__key__!r} has no Energon source info, so it has no stable idx")
        return EncodedRLPrompt.derive_from(
            sample,
            message_log=message_log,
            length=length,
            extra_env_info=sample.extra_env_info,
            loss_multiplier=1.0,
            idx=int(sample.__sources__[0].index),
            task_name=sample.task_name,
            stop_strings=sample.stop_strings,
            messages=apply_task_data_spec(sample.messages, self.adapter.task_data_spec) if self.prompt_messages else None,
        )

    @stateless
    def batch(self, samples: list[EncodedRLPrompt]) -> BatchedDataDict:
        """A ``DatumSpec``-column batch (see the class docstring)."""
        lengths = torch.tensor([s.length for s in samples], dtype=torch.long)
        batch = BatchedDataDict(
            message_log=[s.message_log for s in samples],
            length=lengths,
            extra_env_info=[s.extra_env_info for s in samples],
            loss_multiplier=torch.ones(len(samples), dtype=torch.float32),
            idx=torch.tensor([s.idx for s in samples], dtype=torch.long),
            task_name=[s.task_name for s in samples],
            stop_strings=[s.stop_strings for s in samples],
        )
        if self.include_source_ids:
            batch["source_ids"] = [s.__key__ for s in samples]
        if self.prompt_messages:
            batch["messages"] = [s.messages for s in samples]
        if self.generation_padding != "none":
            batch["input_ids"] = padded_input_ids(
                [s.message_log for s in samples], self.adapter.pad_token_id, left=self.generation_padding == "left"
            )
            batch["input_lengths"] = lengths.clone()
        return self.with_source_datasets(batch, samples)


def padded_input_ids(message_logs: list[list[dict[str, Any]]], pad_token_id: int, *, left: bool) -> torch.Tensor:
    """The message logs' token ids flattened, padded to the longest with ``pad_token_id`` (int64 ``[B, L]``)."""
    rows = [torch.cat([m["token_ids"] for m in log]) for log in message_logs]
    out = torch.full((len(rows), max(len(r) for r in rows)), pad_token_id, dtype=torch.long)
    for index, row in enumerate(rows):
        if left:
            out[index, out.shape[1] - len(row):] = row
        else:
            out[index, : len(row)] = row
    return out


def rl_prompt_stats(batch: Any) -> BatchStats:
    """Prompts and their tokens (no padding, no packing, every prompt counts)."""
    return BatchStats(samples=len(batch["length"]), non_pad_tokens=int(batch["length"].sum()),
                      packing_efficiency=None, zero_loss_samples=0)


def _write_gsm8k_rows(path: Path, limit: int) -> int:
    from rl_data.prompt_data import write_gsm8k_rows

    return write_gsm8k_rows(path, limit)


ADAPTERS = (
    # GSM8K's keys are also the SFT ``prompt_response`` adapter's: detected only under --task rl_prompt.
    AdapterSpec.of(gsm8k, ["question", "answer"], task_only=True),
    AdapterSpec.of(prompt_ground_truth, ["prompt", "ground_truth"]),
    AdapterSpec.of(rl_messages, ["messages", "ground_truth"]),
    AdapterSpec.of(env_info, ["prompt", "extra_env_info"], ["messages", "extra_env_info"]),
)

TASK = Task(
    name="rl_prompt",
    schema=SampleSchema(
        kind=KIND,
        message_lists=("messages",),
        validate=validate_prompt,
        conversations=lambda sample: [list(sample["messages"])],
        reasons=REASONS,
    ),
    encoder_class=RLPromptTaskEncoder,
    cookers={"rl_prompt": RLPromptCooker},
    config_class=RLPromptConfig,
    stats=rl_prompt_stats,
    supports_packing=False,
    adapter_overrides={"add_generation_prompt": True, "add_eos": False},
    left_padded_columns=lambda config: ("input_ids",) if config.generation_padding == "left" else (),
    prompt_batches=True,
    adapters=tuple(spec.name for spec in ADAPTERS),
    adapter_specs=ADAPTERS,
    demo=DemoData(
        description="GSM8K-style arithmetic word problems with their final answers as ground truth",
        write_raw_rows=_write_gsm8k_rows,
        adapter="gsm8k",
    ),
)
