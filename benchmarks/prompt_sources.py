"""The prompt sources the prompt-feed benchmarks compare, behind one small interface.

* :class:`FeedSource`: rl_data's :class:`~rl_data.prompt_feed.feed.PromptFeed` (a named actor
  over ``ranks`` rank actors of 0.5 CPU), called through its clients;
* :class:`LoaderSource`: what public RL frameworks do: a ``torchdata`` ``StatefulDataLoader``
  over the same prompts in the driver, handing out the rows of its batches; a released prompt
  goes back to an in-memory retry queue; the checkpoint is the loader's ``state_dict`` at the
  checkpoint (``cursor="latest"``: the cursor ran ahead of training by every prompt in flight)
  or at the oldest batch that still has an unresolved prompt (``cursor="oldest"``: nothing in
  flight is skipped, but the trained prompts after it are handed out again, since the loader
  does not know which were resolved).

Both encode a prompt the same way: the adapted ``rl_prompt`` sample, the system prompt, the
chat template with the generation prompt (:class:`~rl_data.energon.task_encoders.ProcessorAdapter`).
Prompts are ``(uid, key, payload)``; a uid is ``(epoch, position in the epoch's stream)``.
"""

from __future__ import annotations

import contextlib
import io
from collections import deque
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from rl_data.distributed.config import LoaderSpec, ParallelLayout, RuntimeConfig
from rl_data.energon.dataset_writer import write_energon_dataset
from rl_data.energon.sample_format import encode_sample
from rl_data.energon.task_encoders import ProcessorAdapter
from rl_data.preprocess.adapters import resolve_adapter
from rl_data.prompt_data import arithmetic_word_problems

SYSTEM_PROMPT = "Solve the problem step by step. End with a line '#### <answer>'."
MAX_LENGTH = 512
Uid = tuple[int, int]
Prompt = tuple[Uid, str, Any]


def prompt_samples(count: int, seed: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """``count`` generated word problems as ``(key, rl_prompt sample)``."""
    adapt = resolve_adapter("gsm8k")
    return [
        (f"prompt-{row:06d}", {**adapt(raw), "source": {"file": "bench", "row": row}})
        for row, raw in enumerate(arithmetic_word_problems(count, seed=seed))
    ]


def write_prompt_dataset(root: Path, samples: list[tuple[str, dict[str, Any]]]) -> str:
    """The samples as an Energon dataset (split ``train``) at ``root``."""
    encoded = [(key, encode_sample(sample)) for key, sample in samples]
    write_energon_dataset(root, encoded, samples_per_shard=max(8, len(samples) // 16), splits={"train": 1.0})
    return str(root)


class FeedSource:
    """rl_data's prompt feed (see the module doc); ``restart`` is a crash and a fresh feed."""

    def __init__(
        self, dataset: str, *, name: str, namespace: str, window: int, batch_size: int, timeout_s: float, ranks: int
    ) -> None:
        self._dataset, self._name, self._namespace, self._ranks = dataset, name, namespace, ranks
        self._window, self._batch_size, self._timeout_s = window, batch_size, timeout_s
        self._start()

    def _start(self) -> None:
        from rl_data.prompt_feed.client import attach_feed
        from rl_data.prompt_feed.feed import FeedConfig, start_prompt_feed

        config = RuntimeConfig(
            parallel_layout=ParallelLayout(dp=self._ranks), bundle_resources={"CPU": 0.5}, rank_actor_num_cpus=0.5,
            prefetch_depth=4, name=self._name, namespace=self._namespace,
            step_timeout_s=self._timeout_s, control_timeout_s=self._timeout_s,
        )  # fmt: skip
        spec = LoaderSpec(
            data_config={"energon": {"task": "rl_prompt", "shuffle_buffer_size": 64, "max_samples_per_sequence": 16},
                         "shuffle": True, "system_prompt": SYSTEM_PROMPT, "task": {"generation_padding": "none"}},
            source={"path": self._dataset, "split": "train"},
            batch_size=self._batch_size, max_sequence_length=MAX_LENGTH,
        )  # fmt: skip
        self.handle = start_prompt_feed(config, spec, FeedConfig(max_outstanding=self._window))
        self.rollout, self.trainer = attach_feed(self._name, self._namespace, timeout_s=self._timeout_s)

    def take(self, n: int) -> list[Prompt]:
        return [(tuple(p.uid), p.key, p.payload) for p in self.rollout.take(n)]

    def ack(self, uids: list[Any]) -> None:
        self.trainer.ack(uids)

    def drop(self, uids: list[Any], reason: str) -> None:
        self.trainer.drop(uids, reason)

    def release(self, uids: list[Any]) -> None:
        self.rollout.release(uids)

    def checkpoint(self, directory: str) -> str:
        self.trainer.save_checkpoint(directory)
        return directory

    def restart(self, directory: str) -> None:
        """Kill the feed and its rank actors without shutdown, start a fresh one, restore ``directory``."""
        import ray

        from rl_data.distributed.client import wait_until_name_is_free

        names = ray.get(self.handle.status.remote(), timeout=self._timeout_s)["rank_actor_names"]
        ray.kill(self.handle, no_restart=True)
        for name in names:
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace=self._namespace), no_restart=True)
        wait_until_name_is_free(self._name, self._namespace, self._timeout_s)
        self._start()
        self.trainer.load_checkpoint(directory)

    def close(self) -> None:
        import ray

        from rl_data.distributed.client import wait_until_name_is_free

        with contextlib.suppress(Exception):
            ray.get(self.handle.shutdown.remote(), timeout=self._timeout_s)
        ray.kill(self.handle, no_restart=True)
        wait_until_name_is_free(self._name, self._namespace, self._timeout_s)


class PromptDataset(Dataset):
    """The samples in memory; ``__getitem__`` renders one prompt like the ``rl_prompt`` encoder."""

    def __init__(self, samples: list[tuple[str, dict[str, Any]]], tokenizer: Any) -> None:
        self.samples = samples
        self.adapter = ProcessorAdapter.from_processor(
            tokenizer, {"add_bos": True, "add_eos": False, "add_generation_prompt": True,
                        "system_prompt": SYSTEM_PROMPT}, MAX_LENGTH,
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> dict[str, Any]:
        key, sample = self.samples[index]
        log = self.adapter.format(sample["messages"])
        return {"key": key, "message_log": log, "extra_env_info": sample["extra_env_info"], "idx": index,
                "length": sum(int(m["token_ids"].numel()) for m in log), "task_name": sample["task_name"]}


def _rows(batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The loader's collate: the rows as they are."""
    return batch


class LoaderSource:
    """A driver-side ``StatefulDataLoader`` handing out prompts (see the module doc)."""

    def __init__(self, dataset: PromptDataset, *, batch_size: int, num_workers: int, seed: int, cursor: str = "latest") -> None:
        if cursor not in ("latest", "oldest"):
            raise ValueError(f"cursor must be 'latest' or 'oldest', found {cursor!r}")
        self._dataset, self._batch_size, self._num_workers, self._seed = dataset, batch_size, num_workers, seed
        self.cursor = cursor
        self._build(None)

    def _build(self, state: Any) -> None:
        from torchdata.stateful_dataloader import StatefulDataLoader

        self.loader = StatefulDataLoader(
            self._dataset, batch_size=self._batch_size, shuffle=True, num_workers=self._num_workers,
            generator=torch.Generator().manual_seed(self._seed), collate_fn=_rows,
            persistent_workers=self._num_workers > 0,
        )  # fmt: skip
        self.epoch, self.position = 0, 0
        if state is not None:
            self.loader.load_state_dict(state["loader"])
            self.epoch, self.position = state["epoch"], state["position"]
        self._iterator = iter(self.loader)
        self._pending: deque[Prompt] = deque()  # rows of the current batch not handed out yet
        self._retry: deque[Prompt] = deque()  # released prompts, handed out first
        self._outstanding: dict[Uid, Prompt] = {}  # handed out, not resolved
        self._batches: deque[tuple[dict[str, Any], set[Uid]]] = deque()  # (state before it, its unresolved uids)
        self._batch_of: dict[Uid, set[Uid]] = {}

    def take(self, n: int) -> list[Prompt]:
        out = []
        while len(out) < n:
            if not self._retry and not self._pending:
                self._fetch()
            prompt = (self._retry or self._pending).popleft()
            self._outstanding[prompt[0]] = prompt
            out.append(prompt)
        return out

    def _fetch(self) -> None:
        while True:
            before = {"loader": self.loader.state_dict(), "epoch": self.epoch, "position": self.position}
            try:
                batch = next(self._iterator)
                break
            except StopIteration:  # the epoch is over: the next iter() starts a new one
                self.epoch, self.position = self.epoch + 1, 0
                self._iterator = iter(self.loader)
        uids: set[Uid] = set()
        for row in batch:
            uid = (self.epoch, self.position)
            self.position += 1
            uids.add(uid)
            self._batch_of[uid] = uids
            self._pending.append((uid, row["key"], row))
        self._batches.append((before, uids))

    def ack(self, uids: list[Any]) -> None:
        self._resolve(uids)

    def drop(self, uids: list[Any], reason: str) -> None:
        self._resolve(uids)

    def release(self, uids: list[Any]) -> None:
        self._retry.extend(self._outstanding.pop(tuple(uid)) for uid in uids)

    def _resolve(self, uids: list[Any]) -> None:
        for uid in map(tuple, uids):
            self._outstanding.pop(uid, None)
            self._batch_of.pop(uid).discard(uid)
        while self._batches and not self._batches[0][1]:
            self._batches.popleft()

    def checkpoint(self, directory: str) -> bytes:
        """The loader state at the checkpoint (``latest``) or before the oldest unfinished batch (``oldest``)."""
        if self.cursor == "oldest" and self._batches:
            state = self._batches[0][0]
        else:
            state = {"loader": self.loader.state_dict(), "epoch": self.epoch, "position": self.position}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        return buffer.getvalue()

    def restart(self, saved: bytes) -> None:
        """Everything in memory is lost; a fresh loader restores the saved state."""
        self._build(torch.load(io.BytesIO(saved), weights_only=False))

    def close(self) -> None:
        self._iterator = None
