"""``run_grpo_demo``: an asynchronous GRPO-shaped loop on the prompt feed, with chaos, then accounting.

1. connect to Ray; write the embedded arithmetic word problems and preprocess them into an
   ``rl_prompt`` Energon dataset (unless ``data`` names one); read one pass of its keys (the
   *expected* prompts of every epoch);
2. start the named prompt feed (its rank actors read the prompts in exact passes), the policy
   trainer and ``workers`` rollout workers; every worker keeps one ``generate`` call in flight;
3. as groups come back (out of order): a group whose rollouts all got the same reward is
   dropped (``uniform_reward``: dynamic sampling), the others wait in a buffer; every
   ``groups_per_step`` buffered groups make a training step, after which their prompts are
   acked. The workers take more prompts than a step needs (oversampling, bounded by the
   feed's window) and release the ones whose generation failed;
4. every ``checkpoint_every`` steps: the feed's checkpoint and the trainer's (model, step,
   record of resolved prompts) go into one step folder, then ``latest`` points at it;
5. chaos: after ``kill_worker_at_step`` one rollout worker is killed mid-call (the supervisor
   releases what it held, ``release_holder``, and starts a new one); after ``kill_all_at_step``
   every actor is killed (feed, rank actors, workers, trainer) and fresh ones restore the last
   checkpoint, with the trainer's record rolled back with the model;
6. when every prompt of ``epochs`` epochs is resolved, release what is still out and print the
   accounting table; PASS when each epoch's prompts were resolved exactly once (see
   :mod:`rl_data.jobs.grpo.accounting`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from rich.console import Console
from rich.table import Table

from rl_data.jobs.grpo.accounting import TRAINED, EpochAccount, TrainingRecord, epoch_accounts, stream_account
from rl_data.jobs.grpo.config import TRAINER_CPUS, WORKER_CPUS, GRPODemoConfig
from rl_data.jobs.grpo.policy import StandInPolicy
from rl_data.prompt_feed.outcomes import Outcome
from rl_data.prompt_feed.schedules import ScheduleConfig

UNIFORM_REWARD = "uniform_reward"
LATEST = "latest"
#: Seconds between the loop's questions to the feed, with a schedule, whether the epochs are resolved.
FEED_POLL_S = 0.5


def group_outcome(group: dict[str, Any]) -> Outcome:
    """The outcome the feed's schedule learns from: the group's rollouts, right at reward 1."""
    return Outcome.from_rewards(group["rewards"], correct_at=1.0)


@dataclass
class Counters:
    """Everything that happened, over every lifetime of the actors (never rolled back)."""

    generated: int = 0  # groups rolled out
    regenerated: int = 0  # ... of prompts rolled out before (after a release or a restore)
    failed: int = 0  # generations that failed: released by the worker
    released_by_supervisor: int = 0  # held by a killed worker
    released_at_end: int = 0  # out (buffered or in flight) when the run ended
    rolled_back: int = 0  # resolutions undone by restoring a checkpoint
    out_when_killed: int = 0  # outstanding when every actor was killed (handed out again after the restore)
    feed_totals: Counter = field(default_factory=Counter)  # taken / acked / dropped / released per feed lifetime
    generated_uids: set = field(default_factory=set)  # every uid rolled out so far
    steps: int = 0  # training steps run (re-run steps after a restore included)
    events: list[str] = field(default_factory=list)


@dataclass
class GRPOSummary:
    passed: bool
    accounts: list[EpochAccount]
    counters: Counters
    final_step: int
    seconds: float
    checkpoint: Optional[str]
    #: with a mixture: samples per member the feed's rank actors handed out (last lifetime)
    mixture_counts: Optional[dict[str, int]] = None
    mixture_weights: Optional[dict[str, float]] = None


class _Actors:
    """One lifetime of the feed, the trainer and the rollout workers."""

    def __init__(self, config: GRPODemoConfig, lifetime: int) -> None:
        import ray

        from rl_data.prompt_feed.client import attach_feed
        from rl_data.prompt_feed.feed import start_prompt_feed

        self.config, self.lifetime = config, lifetime
        policy = StandInPolicy(seed=config.seed, group_size=config.group_size, latency_s=config.latency_s)
        from rl_data.jobs.grpo.actors import PolicyTrainer, RolloutWorker

        self._worker_class = ray.remote(RolloutWorker)
        self._policy = policy
        factory = config.loader_spec().load_processor_factory()
        self.dp = config.resume_dp if lifetime and config.resume_dp else config.dp
        self.trainers = [
            ray.remote(PolicyTrainer).options(num_cpus=TRAINER_CPUS, max_restarts=0).remote(factory, config.seed)
            for _ in range(self.dp)
        ]
        self.feed = start_prompt_feed(config.runtime_config(), config.loader_spec(), config.feed_config())
        self.client = attach_feed(config.feed_name, config.namespace, timeout_s=config.timeout_s).trainer
        self.incarnations: Counter = Counter()
        self.workers: dict[str, Any] = {}
        self.calls: dict[Any, str] = {}  # in-flight generate call -> worker name
        ray.get([t.ready.remote() for t in self.trainers], timeout=config.timeout_s)
        if self.dp > 1:  # one model: the ranks start from rank 0's weights
            state = ray.get(self.trainers[0].state_dict.remote(), timeout=config.timeout_s)
            ray.get([t.load_state_dict.remote(state) for t in self.trainers[1:]], timeout=config.timeout_s)

    def start_workers(self) -> None:
        """Start the rollout workers; each keeps one ``generate`` call in flight from now on."""
        import ray

        for index in range(self.config.workers):
            self.spawn_worker(index)
        ray.get([w.ready.remote() for w in self.workers.values()], timeout=self.config.timeout_s)

    def spawn_worker(self, index: int) -> str:
        name = f"{self.config.feed_name}.worker{index}.{self.lifetime}.{self.incarnations[index]}"
        self.incarnations[index] += 1
        options = {"name": name, "namespace": self.config.namespace, "num_cpus": WORKER_CPUS, "max_restarts": 0}
        self.workers[name] = self._worker_class.options(**options).remote(
            name, self.config.feed_name, self.config.namespace, policy=self._policy,
            failure_rate=self.config.failure_rate, seed=self.config.seed, timeout_s=self.config.timeout_s,
        )  # fmt: skip
        self.submit(name)
        return name

    def submit(self, name: str) -> None:
        self.calls[self.workers[name].generate.remote(self.config.prompts_per_call, 1.0)] = name

    def kill_all(self) -> None:
        """Kill every actor without shutdown, as a crash would."""
        import ray

        from rl_data.distributed.client import wait_until_name_is_free

        names = []
        with contextlib.suppress(Exception):
            names = ray.get(self.feed.status.remote(), timeout=self.config.timeout_s)["rank_actor_names"]
        for actor in [self.feed, *self.trainers, *self.workers.values()]:
            ray.kill(actor, no_restart=True)
        for name in names:
            with contextlib.suppress(ValueError):
                ray.kill(ray.get_actor(name, namespace=self.config.namespace), no_restart=True)
        wait_until_name_is_free(self.config.feed_name, self.config.namespace, self.config.timeout_s)

    def shutdown(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.get(self.feed.shutdown.remote(), timeout=self.config.timeout_s)
        self.kill_all()


def run_grpo_demo(config: GRPODemoConfig, console: Optional[Console] = None) -> GRPOSummary:
    """Run the demo on the connected Ray cluster (or a local one); see the module docstring."""
    from rl_data.jobs.ray_cluster import connect_to_ray

    console = console or Console(width=None if os.isatty(1) else 160)
    started = time.perf_counter()
    cpus = config.ranks * 0.5 + config.workers * WORKER_CPUS + max(config.dp, config.resume_dp or 0) * TRAINER_CPUS
    cluster = connect_to_ray(config.namespace, reserved_cpus=cpus)
    console.print(
        f"[bold]grpo_demo[/bold]: {config.ranks} rank actors (logical shards), {config.workers} rollout workers x "
        f"{config.prompts_per_call} prompts per call, groups of {config.group_size}, {config.groups_per_step} "
        f"groups per step on {config.dp} DP ranks (after the restore: {config.resume_dp or config.dp}), window "
        f"{config.max_outstanding}; Ray with {cluster.cpus:g} CPUs; dashboard "
        f"{cluster.dashboard_url or 'off'}"
    )
    console.rule("1. prompts")
    expected_keys = _prepare_prompts(config, console)
    unit = "prompts to resolve in the mixture's endless epoch" if config.mixture else "prompts per epoch"
    console.print(f"{len(expected_keys)} {unit} in {config.dataset_path} at {time.perf_counter() - started:.1f} s")

    goal = f"the first {config.prompt_target} prompts of the mixture" if config.mixture else f"{config.epochs} epochs"
    console.rule(f"2. training until {goal} are resolved")
    counters, record, step = Counters(), TrainingRecord(), 0
    checkpoint: Optional[str] = None
    lifetime = 0
    actors = _Actors(config, lifetime)
    actors.start_workers()
    try:
        loop = _Loop(config, console, actors, counters, record, expected=len(expected_keys))
        while True:
            outcome = loop.run(step)
            step, record = loop.step, loop.record
            checkpoint = loop.checkpoint or checkpoint
            if outcome != "kill_all":
                break
            status = loop.feed_status()
            counters.feed_totals.update(status.get("totals", {}))
            counters.out_when_killed += status.get("outstanding", 0)
            actors.kill_all()
            lifetime += 1
            restored_step, restored = _load_trainer_checkpoint(config)
            counters.rolled_back += len(record.resolutions) - len(restored.resolutions)
            actors = _Actors(config, lifetime)
            _restore(actors, config)
            counters.events.append(
                f"after step {step}: killed every actor; restored step {restored_step} on {actors.dp} DP trainer "
                f"rank(s) ({len(record.resolutions) - len(restored.resolutions)} resolutions rolled back with the model)"
            )
            console.print(f"[red]chaos[/red]: {counters.events[-1]}")
            actors.start_workers()
            loop = _Loop(config, console, actors, counters, restored, expected=len(expected_keys), chaos=False)
            step = restored_step
        loop.finish()
        status = loop.feed_status()
        counters.feed_totals.update(status["totals"])
        feed_epochs = status["epochs"]
        mixture_counts = _mixture_counts(status) if config.mixture else None
    finally:
        actors.shutdown()
    if config.mixture:
        accounts = [stream_account(record, expected_keys, feed_epochs)]
    else:
        accounts = epoch_accounts(record, expected_keys, feed_epochs, config.epochs)
    summary = GRPOSummary(
        passed=all(a.exactly_once for a in accounts), accounts=accounts, counters=counters,
        final_step=step, seconds=time.perf_counter() - started, checkpoint=checkpoint,
        mixture_counts=mixture_counts, mixture_weights=config.mixture,
    )  # fmt: skip
    console.rule(f"summary (job took {summary.seconds:.1f} s)")
    print_summary(summary, console)
    return summary


class _Loop:
    """Groups in, steps out, checkpoints and chaos, for one lifetime of the actors."""

    def __init__(self, config: GRPODemoConfig, console: Console, actors: _Actors, counters: Counters,
                 record: TrainingRecord, *, expected: int, chaos: bool = True) -> None:
        self.config, self.console, self.actors, self.counters = config, console, actors, counters
        self.record, self.expected = record, expected
        self.buffer: list[dict[str, Any]] = []
        self.kill_worker_at = config.kill_worker_at_step if chaos else None
        self.kill_all_at = config.kill_all_at_step if chaos else None
        self.checkpoint: Optional[str] = None
        self.step = 0
        self.resolved = Counter(r.uid[0] for r in record.resolutions)
        self.resolved_first = sum(1 for r in record.resolutions if r.uid[0] == 0 and r.uid[1] < expected)
        self.scheduled, self._polled_at = config.schedule != ScheduleConfig(), 0.0

    def done(self) -> bool:
        if self.config.mixture:  # one endless epoch: its first N positions
            return self.resolved_first >= self.expected
        if all(self.resolved[e] >= self.expected for e in range(self.config.epochs)):
            return True
        return self.scheduled and self._feed_resolved_the_epochs()

    def _feed_resolved_the_epochs(self) -> bool:
        """With a schedule, some prompts of an epoch are skipped, never handed out: the feed says
        (asked at most every :data:`FEED_POLL_S`) when every prompt of the epochs is resolved."""
        if time.monotonic() - self._polled_at < FEED_POLL_S:
            return False
        self._polled_at = time.monotonic()
        epochs = {e["epoch"]: e for e in self.feed_status()["epochs"]}
        return all(epochs.get(e, {}).get("resolved_exactly_once") for e in range(self.config.epochs))

    def run(self, step: int) -> str:
        """Until the epochs are resolved ("done") or the kill-everything step ("kill_all")."""
        import ray

        self.step = step
        while not self.done():
            ready, _ = ray.wait(list(self.actors.calls), num_returns=1, timeout=self.config.timeout_s)
            if not ready:
                raise TimeoutError(f"no rollout worker returned within {self.config.timeout_s:g} s")
            self._collect(ready[0])
            while len(self.buffer) >= self.config.groups_per_step and not self.done():
                self._train_step()
                if self.step % self.config.checkpoint_every == 0:
                    self.checkpoint = _save_checkpoint(self.actors, self.config, self.step, self.record)
                    self.console.print(f"step {self.step}: checkpoint {self.checkpoint}")
                if self.step == self.kill_worker_at:
                    self._kill_a_worker()
                if self.step == self.kill_all_at:
                    return "kill_all"
        return "done"

    def finish(self) -> None:
        """Stop the workers, release every prompt still out (buffered or in flight)."""
        import ray
        from ray.exceptions import RayActorError

        out, by_holder = [g["uid"] for g in self.buffer], 0
        for ref, name in list(self.actors.calls.items()):
            try:
                out += [g["uid"] for g in ray.get(ref, timeout=self.config.timeout_s)["groups"]]
            except RayActorError:
                by_holder += len(self.actors.client.release_holder(name, keep=[g["uid"] for g in self.buffer]))
        self.actors.calls.clear()
        self.actors.client.release(out)
        self.counters.released_at_end += len(out) + by_holder
        self.buffer.clear()

    def feed_status(self) -> dict[str, Any]:
        return self.actors.client.status()

    def _collect(self, ref: Any) -> None:
        import ray
        from ray.exceptions import RayActorError

        name = self.actors.calls.pop(ref)
        try:
            result = ray.get(ref)
        except RayActorError:
            # its groups already in the buffer stay outstanding: they are trained and acked
            released = self.actors.client.release_holder(name, keep=[g["uid"] for g in self.buffer])
            self.counters.released_by_supervisor += len(released)
            index = int(name.split(".worker", 1)[1].split(".")[0])
            self.actors.workers.pop(name)
            new = self.actors.spawn_worker(index)
            self.counters.events.append(f"worker {name} died: released its {len(released)} prompts, started {new}")
            self.console.print(f"[red]chaos[/red]: {self.counters.events[-1]}")
            return
        self.counters.failed += len(result["failed"])
        for group in result["groups"]:
            uid = tuple(group["uid"])
            self.counters.generated += 1
            self.counters.regenerated += uid in self.counters.generated_uids
            self.counters.generated_uids.add(uid)
            if len(set(group["rewards"])) == 1:
                self.actors.client.drop([uid], UNIFORM_REWARD, outcomes=[group_outcome(group)])
                self._resolve(group, UNIFORM_REWARD)
            else:
                self.buffer.append(group)
        self.actors.submit(name)

    def _train_step(self) -> None:
        groups, self.buffer = self.buffer[: self.config.groups_per_step], self.buffer[self.config.groups_per_step :]
        metrics = train_data_parallel(self.actors.trainers, groups, self.config.timeout_s)
        self.actors.client.ack([g["uid"] for g in groups], outcomes=[group_outcome(g) for g in groups])
        self.step += 1
        self.counters.steps += 1
        for group in groups:
            self._resolve(group, TRAINED)
        epochs = sorted({g["uid"][0] for g in groups})
        if self.config.progress:
            self.console.print(
                f"step {self.step}: {len(groups)} groups of epoch(s) {epochs} on {len(self.actors.trainers)} DP ranks, "
                f"mean reward {metrics['mean_reward']:.2f}, "
                f"loss {metrics['loss']:+.4f}, " + (
                    f"resolved {self.resolved_first} of the first {self.expected}" if self.config.mixture
                    else f"resolved per epoch {[self.resolved[e] for e in range(self.config.epochs)]}")
            )

    def _resolve(self, group: dict[str, Any], outcome: str) -> None:
        self.record.add(group["uid"], group["key"], outcome, self.step)
        self.resolved[group["uid"][0]] += 1
        self.resolved_first += group["uid"][0] == 0 and group["uid"][1] < self.expected

    def _kill_a_worker(self) -> None:
        import ray

        name = next(iter(self.actors.calls.values()))
        ray.kill(self.actors.workers[name], no_restart=True)
        self.console.print(f"[red]chaos[/red]: after step {self.step}: killed rollout worker {name} mid-call")


def train_data_parallel(trainers: list[Any], groups: list[dict[str, Any]], timeout_s: float) -> dict[str, float]:
    """One GRPO step on ``len(trainers)`` DP ranks: DP rank d takes groups d, d+D, ...; the
    gradients are averaged over all responses (an all-reduce done here) and applied on every rank."""
    import ray

    shares = [groups[d :: len(trainers)] for d in range(len(trainers))]
    busy = [(t, share) for t, share in zip(trainers, shares) if share]
    results = ray.get([t.gradients.remote(share) for t, share in busy], timeout=timeout_s)
    total = sum(r["responses"] for r in results)
    mean = [sum(r["grads"][i] * (r["responses"] / total) for r in results) for i in range(len(results[0]["grads"]))]
    ray.get([t.apply.remote(mean) for t in trainers], timeout=timeout_s)
    return {
        "loss": sum(r["loss"] * r["responses"] for r in results) / total,
        "mean_reward": sum(r["reward_sum"] for r in results) / total,
        "tokens": sum(r["tokens"] for r in results),
    }


def _prepare_prompts(config: GRPODemoConfig, console: Console) -> list[str]:
    """Preprocess the embedded prompts when needed; return the expected prompt keys: one pass
    (exact passes), or for a mixture the first ``prompt_target`` keys of the feed's stream."""
    from rl_data.jobs.data import is_energon_dataset
    from rl_data.preprocess.pipeline import PreprocessConfig, run_preprocess
    from rl_data.prompt_data import write_gsm8k_rows

    path = Path(config.dataset_path)
    if config.mixture and not all(is_energon_dataset(path / name) for name in config.mixture):
        _preprocess_mixture(config, console)
    elif not config.mixture and not is_energon_dataset(path):
        raw = Path(config.work_dir) / "raw" / f"gsm8k-style-{config.num_prompts}.jsonl"
        rows = write_gsm8k_rows(raw, config.num_prompts)
        summary = run_preprocess(PreprocessConfig(
            inputs=[str(raw)], output=str(path), adapter="gsm8k", task="rl_prompt",
            target_shard_rows=max(4, rows // 16), splits={"train": 1.0}, progress=config.progress,
        ))  # fmt: skip
        console.print(f"preprocessed {summary.accepted} of {rows} rows ({summary.quarantined} quarantined)")
    if config.mixture:
        return _merged_stream_keys(config, config.prompt_target)
    [keys] = _rank_keys(config, ranks=1, rows=None)
    if len(keys) != len(set(keys)):
        raise ValueError(f"the dataset {path} has repeated sample keys; expected each prompt once per pass")
    return keys


def _preprocess_mixture(config: GRPODemoConfig, console: Console) -> None:
    """The generated prompts dealt to the members in turn, preprocessed as one mixture."""
    from rl_data.preprocess.mixture import deal_rows, run_mixture_preprocess
    from rl_data.preprocess.pipeline import PreprocessConfig
    from rl_data.prompt_data import write_gsm8k_rows

    raw = Path(config.work_dir) / "raw" / f"gsm8k-style-{config.num_prompts}.jsonl"
    rows = write_gsm8k_rows(raw, config.num_prompts)
    names = list(config.mixture)
    inputs = deal_rows(raw, names)
    summary = run_mixture_preprocess(PreprocessConfig(
        inputs=inputs, output=config.dataset_path, adapter="gsm8k", task="rl_prompt", overwrite=True,
        target_shard_rows=max(4, rows // (16 * len(names))), splits={"train": 1.0}, progress=config.progress,
    ), dict(config.mixture))  # fmt: skip
    console.print(f"preprocessed a mixture of {rows} rows: " + ", ".join(
        f"{n}={w:g} ({summary.members[n]['accepted']} prompts)" for n, w in config.mixture.items()))


def _rank_keys(config: GRPODemoConfig, *, ranks: int, rows: int | None) -> list[list[str]]:
    """Per logical rank of ``ranks``, its prompt keys in order: one pass, or its first ``rows``
    (read from the loaders directly, as the feed's rank actors build them)."""
    from rl_data.distributed.placement import config_layout, placement_fingerprint
    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    spec = config.loader_spec()
    runtime = config.runtime_config() if ranks == config.ranks else config.runtime_config().model_copy(
        update={"logical_world_size": ranks, "parallel_layout": config.runtime_config().parallel_layout.model_copy(update={"dp": ranks})})
    processor = spec.load_processor_factory()()
    out = []
    for rank in range(ranks):
        loader = build_energon_sft_loader(
            **spec.builder_kwargs(), processor=processor, logical_rank=rank, logical_world_size=ranks,
            placement_fingerprint=placement_fingerprint(config_layout(runtime)),
        )  # fmt: skip
        keys: list[str] = []
        try:
            if rows is None:
                keys = [key for batch in loader for key in batch["source_ids"]]
            else:
                while len(keys) < rows:
                    keys += [key for batch in loader for key in batch["source_ids"]][: rows - len(keys)]
        finally:
            loader.close()
        out.append(keys)
    return out


def _merged_stream_keys(config: GRPODemoConfig, count: int) -> list[str]:
    """The feed's first ``count`` prompt keys: the ranks' streams merged item by item (no pass ends)."""
    per_rank = _rank_keys(config, ranks=config.ranks, rows=-(-count // config.ranks))
    return [per_rank[p % config.ranks][p // config.ranks] for p in range(count)]


def _mixture_counts(status: dict[str, Any]) -> dict[str, int]:
    """Samples per mixture member the feed's rank actors handed out (their status)."""
    counts: Counter = Counter()
    for rank in status.get("ranks", []):
        counts.update((rank.get("mixture") or {}).get("counts", {}))
    return dict(counts)


def _save_checkpoint(actors: _Actors, config: GRPODemoConfig, step: int, record: TrainingRecord) -> str:
    """The feed's and the trainer's checkpoints in one step folder; then ``latest`` names it."""
    import ray

    from rl_data.distributed.checkpoint_files import checkpoint_path, save_checkpoint_file

    folder = Path(config.checkpoint_dir) / f"step_{step:06d}"
    actors.client.save_checkpoint(str(folder / "feed"))
    model = ray.get(actors.trainers[0].state_dict.remote(), timeout=config.timeout_s)  # every rank holds the same
    save_checkpoint_file(checkpoint_path(folder / "trainer"), {"step": step, "record": record.to_json(), "model": model})
    latest = Path(config.checkpoint_dir) / LATEST
    tmp = latest.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "folder": folder.name}))
    os.replace(tmp, latest)
    return str(folder)


def _latest_folder(config: GRPODemoConfig) -> Path:
    latest = json.loads((Path(config.checkpoint_dir) / LATEST).read_text())
    return Path(config.checkpoint_dir) / latest["folder"]


def _load_trainer_checkpoint(config: GRPODemoConfig) -> tuple[int, TrainingRecord]:
    from rl_data.distributed.checkpoint_files import checkpoint_path, load_checkpoint_file

    content = load_checkpoint_file(checkpoint_path(_latest_folder(config) / "trainer"))
    return content["step"], TrainingRecord.from_json(content["record"])


def _restore(actors: _Actors, config: GRPODemoConfig) -> None:
    """Fresh actors: the feed and the trainer's model from the last checkpoint (before any take is served)."""
    import ray

    from rl_data.distributed.checkpoint_files import checkpoint_path, load_checkpoint_file

    folder = _latest_folder(config)
    actors.client.load_checkpoint(str(folder / "feed"))
    model = load_checkpoint_file(checkpoint_path(folder / "trainer"))["model"]
    ray.get([t.load_state_dict.remote(model) for t in actors.trainers], timeout=config.timeout_s)


def print_summary(summary: GRPOSummary, console: Console) -> None:
    """The accounting table and PASS/FAIL."""
    table = Table(title="prompt accounting per epoch (the trainer's record, the data, the feed)")
    for column in ("epoch", "prompts", "trained", "dropped", "skipped", "duplicates", "missing", "feed agrees", "exactly once"):
        table.add_column(column, justify="right")
    for a in summary.accounts:
        dropped = ", ".join(f"{reason} {n}" for reason, n in a.dropped.items()) or "0"
        skipped = ", ".join(f"{reason} {n}" for reason, n in a.skipped.items()) or "0"
        table.add_row(str(a.epoch), str(a.expected), str(a.trained), dropped, skipped, str(a.duplicates), str(a.missing),
                      "yes" if a.feed_agrees else "NO", "yes" if a.exactly_once else "NO")
    console.print(table)
    c = summary.counters
    totals = c.feed_totals
    rows = [
        ("taken (hand-outs, every feed lifetime)", totals["taken"]),
        ("acked (every lifetime, rolled-back ones included)", totals["acked"]),
        ("dropped (every lifetime)", totals["dropped"]),
        ("released (every lifetime)", totals["released"]),
        ("  of which: generation failed", c.failed),
        ("  of which: held by a killed worker", c.released_by_supervisor),
        ("  of which: still out when the run ended", c.released_at_end),
        ("out when every actor was killed (handed out again)", c.out_when_killed),
        ("groups generated", c.generated),
        ("  of which regenerated (released or restored prompts)", c.regenerated),
        ("resolutions rolled back with the model", c.rolled_back),
        ("training steps run (re-runs after the restore included)", c.steps),
        ("final step", summary.final_step),
    ]
    counts = Table(title="counters")
    counts.add_column("what")
    counts.add_column("count", justify="right")
    for what, value in rows:
        counts.add_row(what, str(value))
    console.print(counts)
    for event in c.events:
        console.print(f"event: {event}")
    duplicates = sum(a.duplicates for a in summary.accounts)
    missing = sum(a.missing for a in summary.accounts)
    verdict = "PASS" if summary.passed else "FAIL"
    if summary.mixture_counts is not None:
        total = sum(summary.mixture_counts.values()) or 1
        weight_sum = sum(summary.mixture_weights.values())
        console.print("mixture members in the stream the feed read: " + ", ".join(
            f"{name} {summary.mixture_counts.get(name, 0) / total:.0%} (weight {w / weight_sum:.0%})"
            for name, w in summary.mixture_weights.items()))
        what = f"the first {summary.accounts[0].expected} prompts of the mixture's endless epoch"
    else:
        what = f"{len(summary.accounts)} epochs x {summary.accounts[0].expected if summary.accounts else 0} prompts"
    console.print(
        f"[bold]{verdict}[/bold]: {what}: {duplicates} duplicated, {missing} missing"
        + ("" if summary.passed else "; see the table: prompts were not resolved exactly once")
    )
