"""Micro-benchmarks: chat formatting vs raw encode, packing algorithms, a 32 MB object-store hop
(the worker-to-loader item hop is `benchmarks/worker_items.py`).

* **Chat formatting** (``get_formatted_message_log``, render once and split turns) against the
  tokenizer's raw batch encode of the *same* text (the concatenated turns of the formatted
  log, in batches of 32): the ceiling for formatting. The prefix-render reference
  (``get_formatted_message_log_reference``, quadratic in turns) runs on a subset, where the
  ids of both are also compared. Measured for the project tokenizer and for each chat template
  family (ChatML, Llama-3 headers, ``[INST]``) applied to it. Also: formatting with the
  truncation rule (``get_truncated_formatted_message_log``) against formatting then truncating.
* **Packing**: every algorithm over the workload's token lengths, one call per buffer of
  ``packing_buffer_size``: sequences/s and utilisation / bin efficiency (``packing_metrics``).
* **Transfer**: a 32 MB batch returned by one actor's method and fetched by another actor,
  against ``clone()`` of the same tensor in one process.
"""

from __future__ import annotations

import gc
import itertools
import time
from typing import Any

import torch

from benchmarks.settings import BenchSettings
from benchmarks.workload import conversations
from rl_data.packing.algorithms import PackingAlgorithm, get_packer
from rl_data.packing.metrics import packing_metrics
from rl_data.tokenization.fast_encode import text_encoder
from rl_data.tokenization.chat import (
    formatting_path,
    get_formatted_message_log,
    get_formatted_message_log_reference,
    get_truncated_formatted_message_log,
)
from rl_data.tokenization.templates import TEMPLATE_FAMILIES, tokenizer_with_template
from rl_data.tokenization.truncation import message_log_length, truncate_message_log

RAW_BATCH = 32
TRUNCATION_ROUNDS = 2
TRANSFER_BYTES = 32 * 2**20


def chat_formatting(settings: BenchSettings, tokenizer: Any) -> dict[str, Any]:
    """Tokens/s of formatting, raw batch encode and the reference; ratios; whether ids agree.

    The top-level figures are for ``tokenizer`` (the project's Qwen3 tokenizer, whose template is
    the ``chatml`` family); ``families`` holds the same figures per template family of
    :mod:`rl_data.tokenization.templates` applied to it (``chatml`` repeats the top level) with
    the formatting path each takes. ``reference_ids_identical`` is True only when it holds for
    every family.
    """
    convs = [c["messages"] for c in itertools.islice(conversations(settings.num_conversations, settings.seed), settings.micro_conversations)]
    rounds = settings.chat_rounds
    result = _formatting_figures(convs, tokenizer, rounds)
    families = {"chatml": {key: value for key, value in result.items() if key != "lengths"}}
    for family in TEMPLATE_FAMILIES:
        if family != "chatml":
            figures = _formatting_figures(convs, tokenizer_with_template(tokenizer, family), rounds)
            families[family] = {key: value for key, value in figures.items() if key != "lengths"}
    result["families"] = families
    result["reference_ids_identical"] = all(figures["reference_ids_identical"] for figures in families.values())
    truncation_rounds = min(rounds, TRUNCATION_ROUNDS)
    result["truncation"] = _truncation_figures(convs, tokenizer, settings.max_sequence_length, truncation_rounds)
    return result


def _truncation_figures(
    convs: list[list[dict]], tokenizer: Any, max_sequence_length: int, rounds: int
) -> dict[str, Any]:
    """``get_truncated_formatted_message_log`` against formatting then ``truncate_message_log``, CPU
    seconds over the same conversations (best of ``rounds`` alternating rounds); also how many
    reach the limit and their share of the formatted tokens."""
    lengths = [message_log_length(get_formatted_message_log(messages, tokenizer)) for messages in convs]
    over_long = [length for length in lengths if length >= max_sequence_length]

    def composed() -> None:
        for messages in convs:
            truncate_message_log(get_formatted_message_log(messages, tokenizer), max_sequence_length)

    def truncated() -> None:
        for messages in convs:
            get_truncated_formatted_message_log(messages, tokenizer, max_sequence_length)

    composed_cpu_s = truncated_cpu_s = float("inf")
    for _ in range(rounds):
        composed_cpu_s = min(composed_cpu_s, _timed_cpu(composed)[1])
        truncated_cpu_s = min(truncated_cpu_s, _timed_cpu(truncated)[1])
    return {
        "max_sequence_length": max_sequence_length,
        "over_long_conversations": len(over_long),
        "over_long_token_share": sum(over_long) / max(sum(lengths), 1),
        "formatted_then_truncated_cpu_s": composed_cpu_s,
        "truncated_formatting_cpu_s": truncated_cpu_s,
        "speedup": composed_cpu_s / truncated_cpu_s,
    }


def _formatting_figures(convs: list[list[dict]], tokenizer: Any, rounds: int) -> dict[str, Any]:
    """Formatting vs raw encode of the same text for one tokenizer (see :func:`chat_formatting`).

    Formatting and raw encode are timed alike: each keeps only what it produces per
    conversation (formatting: the joined turn text and token count; raw: nothing), after a
    ``gc.collect()``, best of ``rounds`` alternating rounds, so neither pays for garbage
    collections over the other's results or for a noisy moment.
    """
    subset = max(1, len(convs) // 10)
    logs = [get_formatted_message_log(messages, tokenizer) for messages in convs[:subset]]
    texts, lengths = [], []
    for messages in convs:
        log = get_formatted_message_log(messages, tokenizer)
        texts.append("".join(m["content"] for m in log))
        lengths.append(sum(int(m["token_ids"].numel()) for m in log))
    tokens = sum(lengths)

    def format_all() -> None:
        for messages in convs:
            log = get_formatted_message_log(messages, tokenizer)
            "".join(m["content"] for m in log)

    def encode_all() -> int:
        return sum(
            len(ids)
            for start in range(0, len(texts), RAW_BATCH)
            for ids in tokenizer(texts[start : start + RAW_BATCH], add_special_tokens=False)["input_ids"]
        )

    def backend_encode_all() -> None:  # the Rust backend's offset-free call, no transformers layer
        backend = tokenizer.backend_tokenizer
        for start in range(0, len(texts), RAW_BATCH):
            backend.encode_batch_fast(texts[start : start + RAW_BATCH], add_special_tokens=False)

    encoder = text_encoder(tokenizer)

    def project_encode_all() -> None:  # what formatting calls per conversation (tiktoken where equal)
        for text in texts:
            encoder.encode(text)

    formatting_s = raw_s = backend_s = project_s = formatting_cpu_s = float("inf")
    for _ in range(rounds):
        wall, cpu = _timed_cpu(format_all)
        formatting_s, formatting_cpu_s = min(formatting_s, wall), min(formatting_cpu_s, cpu)
        raw_tokens, elapsed = _timed(encode_all)
        raw_s = min(raw_s, elapsed)
        backend_s = min(backend_s, _timed(backend_encode_all)[1])
        project_s = min(project_s, _timed(project_encode_all)[1])
    begin = time.perf_counter()
    reference = [get_formatted_message_log_reference(messages, tokenizer) for messages in convs[:subset]]
    reference_s = time.perf_counter() - begin
    subset_texts = texts[:subset]
    begin = time.perf_counter()
    for start in range(0, subset, RAW_BATCH):
        tokenizer(subset_texts[start : start + RAW_BATCH], add_special_tokens=False)
    subset_raw_s = time.perf_counter() - begin
    subset_tokens = sum(lengths[:subset])
    identical = all(
        len(a) == len(b) and all(torch.equal(x["token_ids"], y["token_ids"]) for x, y in zip(a, b))
        for a, b in zip(logs, reference)
    )
    return {
        "formatting_path": formatting_path(tokenizer).kind,
        "conversations": len(convs),
        "mean_turns": sum(len(c) for c in convs) / len(convs),
        "tokens": tokens,
        "raw_tokens_same_text": raw_tokens,
        "formatting_tokens_per_s": tokens / formatting_s,
        "formatting_tokens_per_cpu_s": tokens / formatting_cpu_s,
        "raw_batch_encode_tokens_per_s": raw_tokens / raw_s,
        "formatting_vs_raw": (tokens / formatting_s) / (raw_tokens / raw_s),
        "raw_backend_fast_tokens_per_s": tokens / backend_s,
        "formatting_vs_raw_backend_fast": backend_s / formatting_s,
        "project_encoder": encoder.kind,
        "raw_project_encoder_tokens_per_s": tokens / project_s,
        "reference_subset_conversations": subset,
        "reference_tokens_per_s": subset_tokens / reference_s,
        "reference_vs_raw": (subset_tokens / reference_s) / (subset_tokens / subset_raw_s),
        "reference_ids_identical": identical,
        "lengths": lengths,
    }


def _timed(run: Any) -> tuple[Any, float]:
    gc.collect()
    begin = time.perf_counter()
    result = run()
    return result, time.perf_counter() - begin


def _timed_cpu(run: Any) -> tuple[float, float]:
    """Wall and CPU seconds (this process) of ``run()``, after a ``gc.collect()``."""
    gc.collect()
    begin, cpu_begin = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - begin, time.process_time() - cpu_begin


def packing(settings: BenchSettings, lengths: list[int]) -> list[dict[str, Any]]:
    """Every packing algorithm over ``lengths`` (those that fit), in buffers of ``packing_buffer_size``."""
    capacity = settings.max_sequence_length
    fitting = [n for n in lengths if n < capacity]
    buffers = [fitting[i : i + settings.packing_buffer_size] for i in range(0, len(fitting), settings.packing_buffer_size)]
    rows = []
    for algorithm in PackingAlgorithm:
        packer = get_packer(algorithm, capacity, sequence_length_pad_multiple=settings.sequence_length_pad_multiple, seed=settings.seed)
        begin = time.perf_counter()
        all_bins = [packer.pack(buffer) for buffer in buffers]
        elapsed = time.perf_counter() - begin
        metrics = [
            packing_metrics(buffer, bins, capacity, settings.sequence_length_pad_multiple)
            for buffer, bins in zip(buffers, all_bins)
        ]
        bins = sum(m.num_bins for m in metrics)
        rows.append(
            {
                "algorithm": algorithm.value,
                "sequences_per_s": len(fitting) / elapsed,
                "ms_per_buffer": 1e3 * elapsed / max(len(buffers), 1),
                "utilization": sum(m.total_tokens for m in metrics) / max(sum(m.total_capacity for m in metrics), 1),
                "bin_efficiency": sum(m.theoretical_min_bins for m in metrics) / max(bins, 1),
                "bins": bins,
            }
        )
    return rows


class _Producer:
    def __init__(self, kind: str) -> None:
        from rl_data.batched_data_dict import BatchedDataDict

        tensor = torch.arange(TRANSFER_BYTES // 8, dtype=torch.int64)
        self.batch = {"input_ids": tensor} if kind == "dict_of_torch" else BatchedDataDict(input_ids=tensor)

    def make(self) -> Any:
        return self.batch


class _Fetcher:
    def pull(self, producer: Any, repeats: int, timeout: float) -> list[float]:
        import ray

        times = []
        for _ in range(repeats):
            begin = time.perf_counter()
            batch = ray.get(producer.make.remote(), timeout=timeout)
            batch["input_ids"][-1].item()
            times.append(time.perf_counter() - begin)
        return times


def transfer(settings: BenchSettings) -> dict[str, Any]:
    """ms per 32 MB hop between two actors (median of ``transfer_repeats``) vs in-process clone."""
    import ray

    tensor = torch.arange(TRANSFER_BYTES // 8, dtype=torch.int64)
    clones = []
    for _ in range(settings.transfer_repeats):
        begin = time.perf_counter()
        tensor.clone()
        clones.append(time.perf_counter() - begin)
    result = {"bytes": TRANSFER_BYTES, "in_process_clone_ms": 1e3 * sorted(clones)[len(clones) // 2]}
    fetcher = ray.remote(num_cpus=0)(_Fetcher).remote()
    for kind in ("batched_data_dict", "dict_of_torch"):
        producer = ray.remote(num_cpus=0)(_Producer).remote(kind)
        ray.get(fetcher.pull.remote(producer, 1, settings.ray_timeout_s), timeout=settings.ray_timeout_s)  # warm-up
        times = ray.get(fetcher.pull.remote(producer, settings.transfer_repeats, settings.ray_timeout_s), timeout=settings.ray_timeout_s)
        result[f"object_store_{kind}_ms"] = 1e3 * sorted(times)[len(times) // 2]
        ray.kill(producer)
    ray.kill(fetcher)
    return result
