"""Ray Train (``TorchTrainer``, Train V2): every Train worker is one DP rank of a named
:class:`~rl_data.distributed.coordinator.DataCoordinator`; the data state rides inside Train's
checkpoints, so a worker-group restart or a rerun driver resumes the data where the model is.

The driver owns the coordinator: it starts it before ``fit()`` with ``parallel_layout.dp`` equal
to the number of Train workers, and passes :func:`loop_config` to the train loop. A coordinator
dies with the driver that started it unless ``RuntimeConfig(lifetime="detached")``; a rerun
driver starts a new one (or attaches to the detached one) and Train's checkpoint rewinds it::

    coordinator = start_data_coordinator(config, spec)
    trainer = TorchTrainer(
        train_loop, train_loop_config={"data": loop_config(config), "steps": 100},
        scaling_config=ScalingConfig(num_workers=config.parallel_layout.dp),
        run_config=RunConfig(name="sft", storage_path="/shared/runs",
                             failure_config=FailureConfig(max_failures=3)),
    )
    trainer.fit()

    def train_loop(config):
        data = TrainData(config["data"])
        model, optimizer = build()              # e.g. ray.train.torch.prepare_model(...)
        checkpoint = ray.train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as directory:
                load(model, optimizer, directory)
        for step, batch in data.steps(config["steps"], resume_from=checkpoint):
            loss = train_step(model, optimizer, batch)
            data.report({"loss": loss}, save=(lambda d: save(model, optimizer, d)) if step % 10 == 0 else None)

The rules:

* **Resume.** Before any step, DP rank 0 restores the coordinator to the data state inside the
  Train checkpoint (``rl_data_state.pt`` beside the model) or, when Train has none (a restart
  before its first registered checkpoint), to the coordinator's origin; a live coordinator is
  rewound (:meth:`DataCoordinator.load_state_dict`). The other workers wait for it. A data state
  of another dataset, task or layout is refused with the list of differences (Train counts a
  worker failure); a Train checkpoint without a data state is refused too, never taken as a
  fresh start.
* **Steps.** Every worker asks for step k (``expected_step``) and fetches only its own batch
  (``refs[dp_rank]``) onto ``ray.train.torch.get_device()``: on CUDA through pinned memory with a
  non-blocking copy.
* **Report** once per step on every worker (it calls ``ray.train.report``, a barrier). With
  ``save``, the worker writes into a fresh directory and DP rank 0 adds the coordinator's
  checkpoint of step k (taken while k is still pending); Train merges the workers' directories
  into one checkpoint. Every worker should pass ``save`` at the same steps (at least rank 0 must).
* **Commit.** DP rank 0 commits step k with its request for step k + 1, once its ``report`` of k
  returned: every worker had entered that report, so every worker holds its batch of k.
* **Failures.** A worker that dies (or raises) while holding a step: Train restarts the group
  from its last *registered* checkpoint (a ``report`` that returned may not be registered yet)
  and rank 0 rewinds the data to it; the steps after it are produced again, identically. A
  coordinator that does not answer within ``timeout_s`` raises :class:`CoordinatorTimeoutError`
  in the worker: a worker failure that Train retries (``FailureConfig.max_failures``), never a
  hang. A coordinator that died ends the run (every retry fails to attach): rerun the driver.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Optional

from rl_data.distributed.checkpoint_files import CHECKPOINT_FILENAME, checkpoint_path, load_checkpoint_file, save_checkpoint_file
from rl_data.distributed.client import CoordinatorClient, get_coordinator
from rl_data.distributed.config import RuntimeConfig

__all__ = ["CoordinatorTimeoutError", "TrainData", "data_state", "loop_config"]

#: The keys of :func:`loop_config`.
LOOP_CONFIG_KEYS = ("name", "namespace", "dp", "timeout_s")


class CoordinatorTimeoutError(TimeoutError):
    """The data coordinator did not answer a Train worker within ``timeout_s``."""


def loop_config(config: RuntimeConfig, *, timeout_s: float = 600.0) -> dict[str, Any]:
    """What :class:`TrainData` needs in ``train_loop_config``: the coordinator's name, namespace
    and DP size, and how long a worker waits for it (plain values: it is pickled to every worker)."""
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be > 0 seconds, found {timeout_s!r}")
    return {"name": config.name, "namespace": config.namespace, "dp": config.parallel_layout.dp, "timeout_s": float(timeout_s)}


def data_state(checkpoint: Any) -> dict[str, Any]:
    """The coordinator checkpoint inside a ``ray.train.Checkpoint`` (refused clearly when missing)."""
    with checkpoint.as_directory() as directory:
        path = checkpoint_path(directory)
        if not path.exists():
            raise FileNotFoundError(
                f"Train checkpoint {checkpoint.path} holds no rl_data data state ({CHECKPOINT_FILENAME}); "
                "it was not saved through TrainData.report(save=...) on DP rank 0. Resume from a "
                "checkpoint that has one, or start the run under a new RunConfig name"
            )
        return load_checkpoint_file(path)


class TrainData:
    """This Train worker's DP rank of the coordinator named in ``config`` (see the module doc)."""

    def __init__(self, config: Mapping[str, Any], *, device: Any = None) -> None:
        import ray.train

        missing = sorted(set(LOOP_CONFIG_KEYS) - set(config))
        if missing:
            raise ValueError(f"TrainData config lacks {missing}; build it with rl_data.integrations.ray_train.loop_config")
        context = ray.train.get_context()
        self.dp_rank, world_size = context.get_world_rank(), context.get_world_size()
        if world_size != config["dp"]:
            raise ValueError(
                f"the coordinator {config['name']!r} hands out {config['dp']} batches per step "
                f"(parallel_layout.dp={config['dp']}) but this Train run has {world_size} workers; set "
                f"ScalingConfig(num_workers={config['dp']}) or start the coordinator with parallel_layout.dp={world_size}"
            )
        self._name, self._timeout_s = config["name"], config["timeout_s"]
        self._client = CoordinatorClient(get_coordinator(config["name"], config["namespace"]), timeout_s=config["timeout_s"])
        self._device = device
        self._step = self._reported = self._committed = 0
        #: the step this attempt continues after (set by :meth:`steps`: the Train checkpoint's
        #: data step, or the coordinator's origin)
        self.resumed_step: Optional[int] = None

    def steps(self, total_steps: int, *, resume_from: Any = None) -> Iterator[tuple[int, Any]]:
        """``(step, batch)`` from the step after ``resume_from``'s (a ``ray.train.Checkpoint`` or
        None) up to ``total_steps``; the batch is this worker's ``BatchedDataDict`` on its device."""
        start = self._resume(resume_from)
        for step in range(start + 1, total_steps + 1):
            if self._reported != self._step:
                raise RuntimeError(
                    f"step {self._step} was not reported: call TrainData.report(...) once per step on "
                    "every worker (it commits the data and calls ray.train.report)"
                )
            self._step = step
            yield step, self._fetch(step)
        if self.dp_rank == 0 and self._reported > self._committed:
            self._call(lambda: self._client.commit(self._reported), f"committing step {self._reported}")
            self._committed = self._reported

    def report(self, metrics: Mapping[str, Any], *, save: Optional[Callable[[str], None]] = None) -> None:
        """``ray.train.report(metrics)`` for the current step; with ``save``, a checkpoint holding
        what ``save(directory)`` writes plus (DP rank 0) the data state after this step."""
        import ray.train

        step, directory = self._step, None
        try:
            if save is not None:
                directory = tempfile.mkdtemp(prefix=f"rl_data_step{step}_")
                save(directory)
                if self.dp_rank == 0:
                    state = self._call(lambda: self._client.state_dict(step), f"describing the data state of step {step}")
                    save_checkpoint_file(checkpoint_path(directory), state)
            checkpoint = ray.train.Checkpoint.from_directory(directory) if directory else None
            ray.train.report(dict(metrics), checkpoint=checkpoint)
        finally:
            if directory is not None:
                shutil.rmtree(directory, ignore_errors=True)
        self._reported = step

    def _resume(self, checkpoint: Any) -> int:
        """DP rank 0 restores (or rewinds) the coordinator; every worker gets the step to continue after."""
        from ray.train.collective import broadcast_from_rank_zero

        step = None
        if self.dp_rank == 0:
            state = data_state(checkpoint) if checkpoint is not None else self._origin_if_moved()
            if state is None:
                step = self._client.progress()["committed_step"]
            else:
                step = self._call(lambda: self._client.load_state_dict(state), "restoring the data state")
        step = int(broadcast_from_rank_zero(step))
        self._step = self._reported = self._committed = self.resumed_step = step
        return step

    def _origin_if_moved(self) -> Optional[dict[str, Any]]:
        """The coordinator's origin when it handed out steps past it (a restart with no Train
        checkpoint starts over there), else None (nothing to restore)."""
        progress = self._call(self._client.progress, "reporting its progress")
        if progress["handed_step"] == progress["origin_step"]:
            return None
        return self._call(self._client.origin_state_dict, "describing its origin")

    def _fetch(self, step: int) -> Any:
        import ray.train.torch

        commit = self._reported if self.dp_rank == 0 and self._reported > self._committed else None
        _, refs = self._call(lambda: self._client.next_step(step, commit=commit), f"handing out step {step}")
        if commit is not None:
            self._committed = commit
        device = self._device if self._device is not None else ray.train.torch.get_device()
        return self._call(lambda: self._client.fetch(refs[self.dp_rank], device), f"delivering step {step}'s batch")

    def _call(self, call: Callable[[], Any], doing: str) -> Any:
        from ray.exceptions import GetTimeoutError

        try:
            return call()
        except GetTimeoutError:
            raise CoordinatorTimeoutError(
                f"the rl_data coordinator {self._name!r} did not finish {doing} within {self._timeout_s:g} s "
                f"(DP rank {self.dp_rank}); Ray Train counts this as a worker failure and restarts the "
                "group (FailureConfig.max_failures). Check the coordinator's status(), or raise "
                "loop_config(timeout_s=...) if it is only slow"
            ) from None
