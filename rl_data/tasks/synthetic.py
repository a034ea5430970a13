"""``synthetic``: a cheap, exact, stateful source for measuring the runtime itself.

Named by import path (:data:`TASK_PATH`; :func:`synthetic_loader_spec` writes the spec), the task
brings its own loader (``Task.build_loader``): every rank actor builds a :class:`SyntheticLoader`
instead of an Energon loader, and everything above the loader runs unchanged: ``RankActor``
(prefetching, deferred states, rewinds), ``RankPool`` (placement, replacement of dead ranks),
``DataCoordinator`` and ``PromptFeed`` (steps, prompt ledger, checkpoints gathered, checked and
restored), the checkpoint files. Use it to measure a cluster's runtime cost per rank and per
caller without data (``benchmarks/scale.py`` does).

What it skips, exactly: Energon (dataset index, shard reading, WebDataset decoding, worker
processes, Energon's rank state and its save/restore), the tokenizer (:func:`load_stub_tokenizer`:
pad id 0, nothing loaded), chat formatting, cooking, encoding, truncation, packing and padding,
mixtures, and the dataset and adapter parts of the loader identity. Batches are plain dicts of
lists (``source_ids``, ``token_ids``: no ``BatchedDataDict``, no tensors) and a state's filler is a
string (an Energon state carries a uint8 tensor). A rank process imports no torch, transformers or
Energon.

Data: logical rank r of G owns samples ``r * samples_per_rank ..`` (``samples_per_rank`` each),
read in exact passes (every sample once per pass, a new deterministic order per pass when
``data_config["shuffle"]``; the last partial batch of a pass is dropped and counted). Sample g is
``source_id "synthetic-<g>"`` with ``tokens_per_sample`` int32 token ids (``array``), so batches
and prompt payloads have a realistic size. State: ``{"backend": "synthetic", "format_version",
"fingerprint", "identity", "position": {"passes", "batch"}, "filler"}`` (``state_bytes`` of filler
for an Energon state's size); a restore is exact and refuses another identity (rank, world size,
placement, config, source) like an Energon state.
"""

from __future__ import annotations

import functools
import random
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from rl_data.batch_stats import BatchStats
from rl_data.energon.identity import check_restorable
from rl_data.energon.loader_spec import LoaderSpec
from rl_data.fingerprint import fingerprint
from rl_data.stateful import envelope, open_envelope
from rl_data.task_contract import SampleSchema, Task, TaskConfig

#: ``data_config["energon"]["task"]`` of a synthetic loader spec.
TASK_PATH = "rl_data.tasks.synthetic:TASK"
#: ``LoaderSpec.processor_factory`` of a synthetic loader spec.
STUB_TOKENIZER_PATH = "rl_data.tasks.synthetic:load_stub_tokenizer"
STATE_FORMAT, STATE_VERSION = "synthetic", 1
#: Token ids cycle below this.
VOCAB_SIZE = 32_768


class SyntheticConfig(TaskConfig):
    """``data_config["task"]`` of the synthetic task (recorded whole in the loader identity)."""

    samples_per_rank: int = Field(default=4096, ge=1, description="samples of one logical rank's pass")
    tokens_per_sample: int = Field(default=128, ge=1, description="int32 token ids per sample")
    #: A filler string of this many bytes in every state, standing in for what an Energon rank state
    #: carries (its serialized Energon state: ~40 KB unpacked with a shuffle buffer, ~37 KB packed).
    state_bytes: int = Field(default=0, ge=0, description="filler bytes per loader state")


@dataclass(frozen=True)
class StubTokenizer:
    """What a rank actor reads of a tokenizer (pad and EOS ids); nothing is loaded."""

    pad_token_id: int = 0
    eos_token_id: int = 0


def load_stub_tokenizer() -> StubTokenizer:
    """The synthetic task's processor factory (:data:`STUB_TOKENIZER_PATH`)."""
    return StubTokenizer()


@functools.cache
def _vocabulary() -> array:
    return array("i", range(VOCAB_SIZE))


def sample_id(index: int) -> str:
    return f"synthetic-{index}"


class SyntheticLoader:
    """One logical rank's synthetic samples in exact passes (see the module doc); the loader
    contract a rank actor uses: iteration (one pass per ``for`` loop), ``state_dict``,
    ``state_dict_deferring``, ``load_state_dict`` (before iterating), the sample counters, ``close``."""

    STATE_FORMAT, STATE_VERSION = STATE_FORMAT, STATE_VERSION

    def __init__(self, *, identity: dict[str, Any], rank: int, config: SyntheticConfig, batch_size: int, shuffle: bool) -> None:
        self.identity = identity
        self._fingerprint = fingerprint(identity)
        self._first = rank * config.samples_per_rank
        self._samples, self._tokens = config.samples_per_rank, config.tokens_per_sample
        self._batch_size, self._shuffle = batch_size, shuffle
        self._filler = "s" * config.state_bytes
        self._passes = self._batch = 0  # passes finished; batches handed out of the current pass
        self._order: tuple[int, list[int]] | None = None  # (pass, sample order of that pass)
        self._started = False
        self.skipped_samples = self.filtered_samples = 0

    def __len__(self) -> int:
        """Batches per pass."""
        return self._samples // self._batch_size

    @property
    def dropped_samples(self) -> int:
        """Samples the finished passes left in their last partial batch."""
        return self._passes * (self._samples % self._batch_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._started = True
        return self._pass()

    def _pass(self) -> Iterator[dict[str, Any]]:
        """The rest of the current pass; a pass that ends before this loop's first batch (restored
        right after its last batch) is counted and the next one is read, as the Energon stream does."""
        yielded = False
        while True:
            if self._batch == len(self):
                self._passes, self._batch = self._passes + 1, 0
                if yielded:
                    return
            start = self._batch * self._batch_size
            indices = [self._first + i for i in self._pass_order()[start : start + self._batch_size]]
            self._batch, yielded = self._batch + 1, True
            yield {
                "source_ids": [sample_id(g) for g in indices],
                "token_ids": [self._token_ids(g) for g in indices],
            }

    def _pass_order(self) -> list[int]:
        if self._order is None or self._order[0] != self._passes:
            order = list(range(self._samples))
            if self._shuffle:
                random.Random(f"{self._fingerprint}:{self._passes}").shuffle(order)
            self._order = (self._passes, order)
        return self._order[1]

    def _token_ids(self, index: int) -> array:
        """``tokens_per_sample`` consecutive ids from one that depends on ``index``, cycling below
        :data:`VOCAB_SIZE` (slices of one table: a few microseconds per sample)."""
        table, start = _vocabulary(), (index * 7919) % VOCAB_SIZE
        ids = table[start : start + self._tokens]
        while len(ids) < self._tokens:
            ids += table[: self._tokens - len(ids)]
        return ids

    def state_dict(self) -> dict[str, Any]:
        return envelope(STATE_FORMAT, STATE_VERSION, {
            "fingerprint": self._fingerprint,
            "identity": self.identity,
            "position": {"passes": self._passes, "batch": self._batch},
            "filler": self._filler,
        }, format_key="backend")  # fmt: skip

    def state_dict_deferring(self) -> tuple[dict[str, Any], None]:
        """The state and nothing to complete later (a synthetic state is always complete)."""
        return self.state_dict(), None

    def load_state_dict(self, state: dict[str, Any], reweight: bool = False) -> None:
        """Restore a state of this loader's identity, before iterating (refused otherwise)."""
        if self._started:
            raise RuntimeError("restore after iteration started: build a new SyntheticLoader and restore into it")
        if reweight:
            raise ValueError("reweight=True: a synthetic source has no mixture weights; restore with reweight=False")
        fields = open_envelope(
            state, fmt=STATE_FORMAT, version=STATE_VERSION, what="synthetic loader",
            fields=("fingerprint", "identity", "position", "filler"), format_key="backend",
        )  # fmt: skip
        check_restorable(fields["identity"], self.identity, saved_fingerprint=fields["fingerprint"])
        position = fields["position"]
        passes, batch = (position.get(key) if isinstance(position, dict) else None for key in ("passes", "batch"))
        if type(passes) is not int or type(batch) is not int or passes < 0 or not 0 <= batch <= len(self):
            raise ValueError(
                f"synthetic loader state position is {position!r}, expected {{'passes': int >= 0, 'batch': 0..{len(self)}}}; "
                "the checkpoint is damaged"
            )
        self._passes, self._batch = passes, batch

    def close(self) -> None:
        """Nothing to stop (no worker processes)."""


def build_synthetic_loader(
    spec: LoaderSpec, processor: Any, *, logical_rank: int, logical_world_size: int, placement_fingerprint: str, task: Task | None = None
) -> SyntheticLoader:
    """The synthetic loader of one logical shard (``Task.build_loader`` of :data:`TASK`; the
    signature of ``rl_data.energon.sft_dataloader.build_loader``)."""
    source, loader_config = spec.source, spec.data_config.energon
    problems = []
    if source.path is None or source.epoch_mode != "exact" or source.virtual_epoch_length != 0:
        problems.append(
            f"source {source.describe()!r} has epoch_mode {source.epoch_mode!r} and virtual_epoch_length "
            f"{source.virtual_epoch_length}, expected a path (a name only), epoch_mode 'exact' and 0"
        )
    if loader_config.num_workers != 0:
        problems.append(f"data_config['energon']['num_workers'] is {loader_config.num_workers}, expected 0 (no worker processes)")
    config = TASK.config(spec.data_config.task)
    if config.samples_per_rank < spec.batch_size:
        problems.append(f"samples_per_rank {config.samples_per_rank} is below batch_size {spec.batch_size}: a pass has no batch")
    if problems:
        raise ValueError("synthetic loader: " + "; ".join(problems))
    identity = {
        "task": {"name": TASK.name, "config": config.model_dump()},
        "source": source.model_dump(mode="json"),
        "split_role": spec.split_role,
        "batch_size": spec.batch_size,
        "shuffle": bool(spec.data_config.shuffle),
        "state_format_version": STATE_VERSION,
        "topology": {"placement": placement_fingerprint, "logical_rank": logical_rank, "logical_world_size": logical_world_size},
    }
    return SyntheticLoader(
        identity=identity, rank=logical_rank, config=config, batch_size=spec.batch_size, shuffle=bool(spec.data_config.shuffle)
    )


def synthetic_loader_spec(
    *, batch_size: int, samples_per_rank: int = 4096, tokens_per_sample: int = 128, state_bytes: int = 0, name: str = "synthetic"
) -> LoaderSpec:
    """A training ``LoaderSpec`` of the synthetic task (``name`` is the source's path: a name only)."""
    return LoaderSpec(
        data_config={
            "energon": {"task": TASK_PATH},
            "shuffle": True,
            "task": {"samples_per_rank": samples_per_rank, "tokens_per_sample": tokens_per_sample, "state_bytes": state_bytes},
        },
        source={"path": name, "split": "train"},
        processor_factory=STUB_TOKENIZER_PATH,
        batch_size=batch_size,
        max_sequence_length=tokens_per_sample,
    )


def synthetic_stats(batch: dict[str, Any]) -> BatchStats:
    return BatchStats(
        samples=len(batch["source_ids"]), non_pad_tokens=sum(len(ids) for ids in batch["token_ids"]), packing_efficiency=None
    )


def _never_stored(sample: Any, media: bool = False) -> None:
    raise ValueError("synthetic samples are generated by their loader, never stored: there is nothing to preprocess")


TASK = Task(
    name="synthetic",
    schema=SampleSchema(kind="synthetic", message_lists=(), validate=_never_stored, conversations=lambda sample: []),
    encoder_class=None,
    cookers={},
    config_class=SyntheticConfig,
    stats=synthetic_stats,
    supports_packing=False,
    prompt_batches=True,
    build_loader=build_synthetic_loader,
)
