"""Schema adapters: one raw row (a dict) -> one canonical sample (see ``energon.sample_format``).

An adapter is a ``TaskDataPreProcessFnCallable``-style function ``adapter(row) -> sample``
returning ``{"kind": "sft", "messages": [...]}`` (optionally ``tools``) or ``{"kind":
"preference", "context": [...], "chosen": [...], "rejected": [...]}``, without ``source``. It
raises :class:`~rl_data.preprocess.validation.RowRejected` for rows it cannot map; everything
else is checked afterwards by :func:`~rl_data.preprocess.validation.validate_sample`.

Built-in adapters are chosen by name or detected from the keys of the first rows; a user
adapter is given by import path ``"package.module:function"``, imported on the driver. Its
module is shipped to the Ray workers by value (cloudpickle), so the workers need only the
packages that module itself imports.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from rl_data.import_path import load_object
from rl_data.preprocess.media import MEDIA_COLUMNS
from rl_data.preprocess.validation import RowRejected
from rl_data.task_contract import Adapter, AdapterSpec
from rl_data.task_registry import registered_tasks

SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
    "bing": "assistant", "bard": "assistant", "model": "assistant", "system": "system", "tool": "tool",
    "observation": "tool",
}
_PLACEHOLDER = re.compile(r"<(image|video|audio)>")


ADAPTERS: dict[str, AdapterSpec] = {}


def register_adapter(
    name: str, *detect_keys: Sequence[str], task_only: bool = False
) -> Callable[[Adapter], Adapter]:
    """Decorator registering ``fn`` under ``name``; rows holding all of one key set are detected as it.

    ``task_only`` adapters take part in detection only among a task's adapters (``--task``), for
    schemas whose keys another task's adapter also detects (GSM8K ``question``/``answer``).
    """

    def decorate(fn: Adapter) -> Adapter:
        ADAPTERS[name] = AdapterSpec(name, fn, tuple(frozenset(keys) for keys in detect_keys), task_only)
        return fn

    return decorate


def _register_task_adapters() -> None:
    """Add the adapters the registered tasks define (e.g. ``rl_prompt``'s ``gsm8k``)."""
    for task in registered_tasks().values():
        for spec in task.adapter_specs:
            known = ADAPTERS.setdefault(spec.name, spec)
            if known.fn is not spec.fn:
                raise ValueError(
                    f"task {task.name!r} defines adapter {spec.name!r}, but another adapter has that name; "
                    "rename one of them"
                )


@lru_cache(maxsize=None)
def resolve_adapter(name: str) -> Adapter:
    """A registered adapter by name, or a user callable by import path ``"pkg.module:function"``."""
    _register_task_adapters()
    if name in ADAPTERS:
        return ADAPTERS[name].fn
    if ":" not in name:
        raise ValueError(
            f"unknown adapter {name!r}; expected one of {sorted(ADAPTERS)}, 'auto', or an import "
            "path 'package.module:function'"
        )
    fn = load_object(name, "adapter", hint="the module must be importable on the driver (on sys.path / PYTHONPATH) and define that function")
    if not callable(fn):
        raise ValueError(f"adapter {name!r} is a {type(fn).__name__}, not a callable(row) -> sample")
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[name.partition(":")[0]])
    return fn


def detect_adapter(rows: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> str:
    """The adapter (of ``names``, default all) whose schema matches the most ``rows``.

    ``ValueError`` if none matches or several match equally often.
    """
    _register_task_adapters()
    if names is None:
        candidates = [spec for spec in ADAPTERS.values() if not spec.task_only]
    else:
        candidates = [ADAPTERS[name] for name in names if name in ADAPTERS]
    matches = {spec.name: 0 for spec in candidates}
    for row in rows:
        for spec in candidates:
            if any(keys <= row.keys() for keys in spec.detect_keys):
                matches[spec.name] += 1
    best = max(matches.values(), default=0)
    keys_seen = sorted({key for row in rows for key in row})
    if best == 0:
        known = "; ".join(f"{s.name}: {' or '.join(str(sorted(k)) for k in s.detect_keys)}" for s in candidates)
        raise ValueError(
            f"no adapter matches the input rows (keys found: {keys_seen}); known schemas: {known}. "
            "Pass --adapter NAME or --adapter package.module:function"
        )
    tied = sorted(name for name, count in matches.items() if count == best)
    if len(tied) > 1:
        raise ValueError(
            f"ambiguous input schema: {best} of {len(rows)} sampled rows match each of {tied} "
            f"(keys found: {keys_seen}); pass --adapter with one of {tied}"
        )
    return tied[0]


@register_adapter("openai", ["messages"])
def openai_messages(row: dict[str, Any]) -> dict[str, Any]:
    """OpenAI chat format: ``{"messages": [{"role", "content", ...}], "tools"?: [...]}``.

    Content parts may be media (``{"type": "image", "image": "cat.jpg"}``, ...); the row's
    ``images`` / ``videos`` / ``audios`` columns are kept for them (see ``preprocess.media``).
    """
    messages = _field(row, "messages", list)
    sample: dict[str, Any] = {"kind": "sft", "messages": list(messages), **_media_columns(row)}
    if row.get("tools"):
        sample["tools"] = _field(row, "tools", list)
    return sample


@register_adapter("sharegpt", ["conversations"])
def sharegpt(row: dict[str, Any]) -> dict[str, Any]:
    """ShareGPT: ``{"conversations": [{"from": "human"|"gpt"|..., "value": str}], "system"?: str}``.

    LLaVA style: when the row has a media column (``image``/``images``, ``video``/``videos``,
    ``audio``/``audios``: a path or a list of paths/bytes), each ``<image>``, ``<video>`` or
    ``<audio>`` in a value becomes a media part taking the next item of that column.
    """
    columns = _media_columns(row)
    messages = _system(row)
    for index, turn in enumerate(_field(row, "conversations", list)):
        if not isinstance(turn, dict) or "from" not in turn or "value" not in turn:
            raise RowRejected("missing_field", f"conversations[{index}] must have 'from' and 'value', found {turn!r:.80}")
        speaker = turn["from"]
        if speaker not in SHAREGPT_ROLES:
            raise RowRejected(
                "invalid_role", f"conversations[{index}]: unknown speaker {speaker!r}; expected one of {sorted(SHAREGPT_ROLES)}"
            )
        value = turn["value"]
        content = _media_parts(value) if columns and isinstance(value, str) else value
        messages.append({"role": SHAREGPT_ROLES[speaker], "content": content})
    return {"kind": "sft", "messages": messages, **columns}


@register_adapter("alpaca", ["instruction", "output"])
def alpaca(row: dict[str, Any]) -> dict[str, Any]:
    """Alpaca: ``{"instruction": str, "input"?: str, "output": str, "system"?: str}``.

    The user turn is the instruction, followed by a blank line and the input when there is one.
    """
    instruction = _text_field(row, "instruction")
    extra = row.get("input") or ""
    if not isinstance(extra, str):
        raise RowRejected("non_text_content", f"'input' must be text, found {type(extra).__name__}")
    prompt = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    return {"kind": "sft", "messages": _system(row) + [
        {"role": "user", "content": prompt}, {"role": "assistant", "content": _text_field(row, "output")}]}


@register_adapter("prompt_response", ["prompt", "response"], ["question", "answer"])
def prompt_response(row: dict[str, Any]) -> dict[str, Any]:
    """One exchange: ``{"prompt", "response"}`` or ``{"question", "answer"}`` (``"system"`` optional).

    The answer is kept verbatim, so a GSM8K-style reasoning answer keeps its ``#### 42`` final
    answer line as the last line of the assistant turn.
    """
    prompt_key, answer_key = ("prompt", "response") if "prompt" in row else ("question", "answer")
    return {"kind": "sft", "messages": _system(row) + [
        {"role": "user", "content": _text_field(row, prompt_key)},
        {"role": "assistant", "content": _text_field(row, answer_key)}]}


@register_adapter("preference", ["prompt", "chosen", "rejected"])
def preference(row: dict[str, Any]) -> dict[str, Any]:
    """Preference pair: ``{"prompt", "chosen", "rejected"}`` kept as a preference sample.

    ``prompt`` is a string or a message list; ``chosen``/``rejected`` are a string (one
    assistant turn), a message dict or a message list (a leading copy of the prompt is removed).
    """
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        context = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, list):
        context = list(prompt)
    else:
        raise RowRejected("missing_field", f"'prompt' must be a string or a message list, found {prompt!r:.80}")
    return {"kind": "preference", "context": _system(row) + context,
            "chosen": _completion(row, "chosen", context), "rejected": _completion(row, "rejected", context)}


def _completion(row: dict[str, Any], key: str, context: list) -> list:
    value = row.get(key)
    if isinstance(value, str):
        return [{"role": "assistant", "content": value}]
    if isinstance(value, dict):
        return [value]
    if isinstance(value, list):
        return value[len(context):] if value[: len(context)] == context else value
    raise RowRejected("missing_field", f"{key!r} must be a string, a message or a message list, found {value!r:.80}")


def _media_columns(row: dict[str, Any]) -> dict[str, list]:
    """The row's media columns as lists under their plural names (``image: x`` -> ``images: [x]``)."""
    columns = {}
    for plural in MEDIA_COLUMNS.values():
        for key in (plural, plural[:-1]):
            value = row.get(key)
            if value is not None and value != []:
                columns[plural] = value if isinstance(value, list) else [value]
                break
    return columns


def _media_parts(text: str) -> str | list[dict[str, str]]:
    """``"<image>\nWhat is it?"`` -> ``[{"type": "image"}, {"type": "text", "text": "\nWhat is it?"}]``."""
    pieces = _PLACEHOLDER.split(text)
    if len(pieces) == 1:
        return text
    parts = []
    for index, piece in enumerate(pieces):
        if index % 2:
            parts.append({"type": piece})
        elif piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _system(row: dict[str, Any]) -> list[dict[str, Any]]:
    system = row.get("system")
    return [{"role": "system", "content": system}] if system else []


def _field(row: dict[str, Any], key: str, kind: type) -> Any:
    if key not in row:
        raise RowRejected("missing_field", f"row has no {key!r} field (keys: {sorted(row)})")
    if not isinstance(row[key], kind):
        raise RowRejected("missing_field", f"{key!r} must be a {kind.__name__}, found {type(row[key]).__name__}")
    return row[key]


def _text_field(row: dict[str, Any], key: str) -> str:
    if key not in row or row[key] is None:
        raise RowRejected("missing_field", f"row has no {key!r} field (keys: {sorted(row)})")
    if not isinstance(row[key], str):
        raise RowRejected("non_text_content", f"{key!r} must be text, found {type(row[key]).__name__}")
    return row[key]
