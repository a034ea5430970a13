"""Bad samples: one compact log line each, a skip count, and a budget that makes them fatal;
samples a task encoder filters out on purpose: a log line and their own count.

Energon calls the worker config's error handler for every sample that fails in a pipeline
stage, then drops it and fetches the next one. :func:`compact_sample_error_handler` logs one
line (dataset path, shard, index, key, exception) and adds the dropped samples to the skip
counter of the active :class:`SkipCountingWorkerConfig`. The counter lives in shared memory
created before Energon forks its workers, so the loader in the main process sees the skips
of every worker.

Energon's own guard, ``max_consecutive_failures`` per stage and per worker, does not catch an
always-failing encoder on a small split (the split just ends empty), so the loader also checks
the skip ratio after every batch and an epoch that yielded nothing (see
``EnergonSFTDataLoader``); both raise :class:`SampleFailureBudgetExceeded`.

A task encoder filters a sample it must not deliver (an RL prompt longer than the maximum
length, which is never truncated) with :func:`filter_sample`: it is logged, counted in the
shared ``filtered`` counter (not a failure: the budget does not see it) and dropped through
Energon's ``SkipSample``, which neither calls the error handler nor counts as a failure.
"""

from __future__ import annotations

import logging
import multiprocessing
from dataclasses import dataclass
from typing import Any, NoReturn

from megatron.energon import SkipSample, SourceInfo, WorkerConfig
from megatron.energon.source_info import get_source_info

logger = logging.getLogger(__name__)

_MAX_MESSAGE = 300
_MAX_SOURCES_SHOWN = 3


class SampleFailureBudgetExceeded(RuntimeError):
    """Too many samples of one source failed: the data or the encoder is broken."""


@dataclass(slots=True, kw_only=True, eq=False)
class SkipCountingWorkerConfig(WorkerConfig):
    """An Energon ``WorkerConfig`` that also carries the skip and filter counters and the failure budget."""

    #: Samples skipped by the error handler, in all processes (a ``multiprocessing.Value``).
    skipped: Any = None
    #: Samples filtered out by the task encoder (:func:`filter_sample`), in all processes.
    filtered: Any = None
    #: Consecutive failures of one stage that are fatal (Energon's failure tolerance).
    max_consecutive_failures: int = 100
    #: Fatal once skipped / (skipped + delivered) exceeds this ...
    max_failure_ratio: float = 0.1
    #: ... after at least this many samples were seen.
    failure_ratio_min_samples: int = 100
    #: Samples skipped or filtered in this process only (each forked worker counts its own):
    #: what a pass's accounting subtracts from its share (``epoch_stream.PassEndDataset``).
    process_skipped: int = 0

    @classmethod
    def create(cls, **fields: Any) -> "SkipCountingWorkerConfig":
        """A config with fresh shared skip and filter counters (create it before the loader forks)."""
        return cls(skipped=multiprocessing.Value("q", 0), filtered=multiprocessing.Value("q", 0), **fields)

    def add_skipped(self, count: int) -> None:
        self.process_skipped += count
        with self.skipped.get_lock():
            self.skipped.value += count

    def skipped_count(self) -> int:
        return int(self.skipped.value)

    def add_filtered(self, count: int) -> None:
        self.process_skipped += count
        with self.filtered.get_lock():
            self.filtered.value += count

    def filtered_count(self) -> int:
        return int(self.filtered.value)

    def check_ratio(self, delivered: int, source_name: str) -> None:
        """Raise when the skipped share of all samples seen exceeds the budget."""
        skipped = self.skipped_count()
        seen = skipped + delivered
        if seen >= self.failure_ratio_min_samples and skipped > self.max_failure_ratio * seen:
            raise SampleFailureBudgetExceeded(
                f"{source_name}: {skipped} of {seen} samples were skipped "
                f"({skipped / seen:.1%}), more than max_failure_ratio {self.max_failure_ratio}; "
                "fix the data or the task encoder (see the 'skipped sample' log lines), or "
                "raise max_failure_ratio in data_config['energon']"
            )


def empty_pass_error(source: str, *, dropped: int, skipped: int, filtered: int, batch_size: Any) -> Exception:
    """Why a whole pass of one rank yielded no batch: every sample failed (``skipped``), was
    filtered, or the rest did not fill one batch (``dropped``), with the fix for each."""
    if skipped > 0:
        return SampleFailureBudgetExceeded(
            f"{source}: a whole pass yielded no batch and skipped {skipped} sample(s); every sample "
            "failed, so the data or the task encoder is systematically broken (see the 'skipped "
            "sample' log lines)"
        )
    if filtered:
        return ValueError(
            f"{source}: a whole pass of this rank yielded no batch; the task encoder filtered out "
            f"{filtered} sample(s) (e.g. prompts over max_sequence_length) and the rest did not fill "
            "one batch; raise max_sequence_length or use a smaller batch size"
        )
    return ValueError(
        f"{source}: a whole pass of this rank yielded no batch; its {dropped} sample(s) did not fill "
        f"one batch of batch_size {batch_size} in any worker; use a smaller batch size, fewer workers "
        "or ranks, or more data"
    )


def compact_sample_error_handler(
    exception: Exception, sample: Any | list[Any], sources: list[SourceInfo] | None = None
) -> None:
    """Log a sample-processing error and let Energon request another sample."""
    error = exception
    if sources is None and exception.__cause__ is not None:
        error = exception.__cause__  # e.g. undecodable JSON: the real error is the cause
    if sources is None:
        sources = get_source_info(sample)
    message = " ".join(str(error).split())
    if len(message) > _MAX_MESSAGE:
        message = message[: _MAX_MESSAGE - 3] + "..."
    logger.warning(
        "skipped sample: %s: %s: %s",
        _describe_sources(sources, sample),
        type(error).__name__,
        message,
    )
    config = WorkerConfig.active_worker_config
    if isinstance(config, SkipCountingWorkerConfig):
        config.add_skipped(len(sample) if isinstance(sample, (list, tuple)) else 1)


def filter_sample(sample: Any, reason: str) -> NoReturn:
    """Drop ``sample`` from a task encoder stage on purpose: log it, count it, raise ``SkipSample``."""
    logger.info("filtered sample: %s: %s", _describe_sources(get_source_info(sample), sample), reason)
    config = WorkerConfig.active_worker_config
    if isinstance(config, SkipCountingWorkerConfig):
        config.add_filtered(1)
    raise SkipSample()


def _describe_sources(sources: list[SourceInfo] | None, sample: Any) -> str:
    if not sources:
        key = (
            sample.get("__key__") if isinstance(sample, dict) else getattr(sample, "__key__", None)
        )
        return f"key={key}" if key is not None else "source unknown"
    parts = [
        f"dataset={src.dataset_path} shard={src.shard_name} index={src.index} "
        f"key={src.file_names[0].split('.')[0] if src.file_names else '?'}"
        for src in sources[:_MAX_SOURCES_SHOWN]
    ]
    if len(sources) > _MAX_SOURCES_SHOWN:
        parts.append(f"and {len(sources) - _MAX_SOURCES_SHOWN} more")
    return ", ".join(parts)
