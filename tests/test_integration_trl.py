"""TRL's GRPOTrainer on the prompt feed (``rl_data.integrations.trl``), for real, on this CPU.

A tiny Qwen2 policy built from a config (random weights, no hub), the project's offline Qwen3
tokenizer, TRL's own generation, a Math-Verify reward against the ground truth of GSM8K-style
prompts, a real feed over a real ``rl_prompt`` Energon dataset on the test session's Ray. The
reward function logs every completion it scores (attempt, step, key); how many optimizer steps
trained each prompt in the surviving history (the steps up to the checkpoint a crashed run
resumed from, then the resumed run's) is counted from that log and checked against the data,
the checkpoint chain and the feed's ledger. TRL's own resume runs beside it on the same prompts.

CPU: a GRPO step costs ~0.6 CPU-s (mostly the 151k-token vocabulary; one torch thread, completions
of 4 tokens, hidden size 16), a feed start ~10 (its rank actors): the tests whose subject is not a
fresh feed share one, rewound to its start where they count from there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import textwrap
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from distributed_fixtures import TIMEOUT_S, runtime_config, shut_down

from rl_data.distributed.checkpoint_files import checkpoint_path, load_checkpoint_file
from rl_data.distributed.config import LoaderSpec, RuntimeConfig
from rl_data.energon.dataset_writer import write_energon_dataset
from rl_data.energon.sample_format import encode_sample
from rl_data.integrations.trl import (
    FEED_FOLDER,
    GenerationWindow,
    TRLPromptFeed,
    check_settings,
    prompt_row,
    reward_columns,
)
from rl_data.preprocess.adapters import resolve_adapter
from rl_data.prompt_data import arithmetic_word_problems
from rl_data.prompt_feed.ledger import TakenPrompt
from rl_data.prompt_feed.merge import Uid
from rl_data.prompt_feed.outcomes import PromptHistory
from rl_data.prompt_feed.feed import FeedConfig, start_prompt_feed
from rl_data.rewards import ground_truth_from_gsm8k_answer, math_reward

#: 12 prompts, 2 ranks x 6, loader batches of 3: every epoch holds all 12. GRPO: 4 completions
#: per step, 2 per prompt: 2 prompts a step, an epoch in 6 steps (CPU cost grows with prompt
#: tokens x the 151k vocabulary, so prompts stay short: no system prompt).
PROMPTS, WORLD, BATCH, STEPS = 12, 2, 3, 6
KEYS = [f"prompt-{i:03d}" for i in range(PROMPTS)]
NAMESPACE = "rl_data_trl_tests"


class Crash(RuntimeError):
    """The simulated crash of a training job."""


def _problems(seed: int = 0) -> list[dict[str, str]]:
    return arithmetic_word_problems(PROMPTS, seed=seed)


def _write_prompts(root: Path, seed: int = 0) -> str:
    adapt = resolve_adapter("gsm8k")
    samples = [
        (KEYS[row], encode_sample({**adapt(raw), "source": {"file": "gsm8k", "row": row}}))
        for row, raw in enumerate(_problems(seed))
    ]
    write_energon_dataset(root, samples, samples_per_shard=4, splits={"train": 1.0})
    return str(root)


@pytest.fixture(scope="module")
def prompt_root(tmp_path_factory) -> str:
    return _write_prompts(tmp_path_factory.mktemp("trl_prompts"))


@pytest.fixture(scope="module")
def trl_tokenizer(tokenizer):
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _spec(root: str, **task: Any) -> LoaderSpec:
    energon = {"task": "rl_prompt", "num_workers": 0, "shuffle_buffer_size": 6, "max_samples_per_sequence": 2}
    return LoaderSpec(
        data_config={"energon": energon, "shuffle": True,
                     "task": {"prompt_messages": True, "generation_padding": "none", **task}},
        source={"path": root, "split": "train"},
        batch_size=BATCH,
        max_sequence_length=256,
    )  # fmt: skip


def _config(world: int = WORLD) -> RuntimeConfig:
    return runtime_config(world, 2, namespace=NAMESPACE, name=f"trl-feed-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def running_feed(ray: Any, spec: LoaderSpec, world: int = WORLD, max_outstanding: int = 16,
                 config: RuntimeConfig | None = None) -> Iterator[Any]:
    config = config or _config(world)
    handle = start_prompt_feed(config, spec, FeedConfig(max_outstanding=max_outstanding, take_wait_s=1.0))
    try:
        yield handle
    finally:
        shut_down(ray, handle, config.name, config.namespace)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """One intra-op thread for this process's trainers: two threads only spin on this 2-core machine
    shared with another test process (twice the CPU per step)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclasses.dataclass(frozen=True)
class SharedFeed:
    """The module's running feed over the prompts and its state before its first take."""

    config: RuntimeConfig
    handle: Any
    fresh_state: dict[str, Any]

    def rewound(self) -> Any:
        """The handle, the feed rewound to its state before its first take (epoch 0, nothing taken
        or held; its call totals go on); each rank builds a new loader for it."""
        import ray

        ray.get(self.handle.load_state_dict.remote(self.fresh_state), timeout=TIMEOUT_S)
        return self.handle


@pytest.fixture(scope="module")
def shared_feed(ray_session, prompt_root) -> Iterator[SharedFeed]:
    """One feed for the tests whose subject is not a fresh feed: those that count from its start
    take :meth:`SharedFeed.rewound`, the others its ``handle`` (each goes on where the last stopped)."""
    config = _config()
    with running_feed(ray_session, _spec(prompt_root), config=config) as handle:
        yield SharedFeed(config, handle, ray_session.get(handle.state_dict.remote(), timeout=TIMEOUT_S))


def _status(feed: Any) -> dict[str, Any]:
    import ray

    return ray.get(feed.status.remote(), timeout=TIMEOUT_S)


def _policy(tokenizer: Any) -> Any:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=True)  # fmt: skip
    return Qwen2ForCausalLM(config)


def _grpo_config(output_dir: Path, **overrides: Any) -> Any:
    """rl_data's settings (shuffle_dataset=False, ignore_data_skip=True); ``trl_defaults`` drops them."""
    from trl import GRPOConfig

    args: dict[str, Any] = dict(
        output_dir=str(output_dir), use_cpu=True, bf16=False, seed=0, report_to=[], disable_tqdm=True,
        logging_steps=1000, per_device_train_batch_size=4, num_generations=2, max_completion_length=4,
        max_steps=STEPS, save_steps=2, shuffle_dataset=False, ignore_data_skip=True,
    )  # fmt: skip
    if overrides.pop("trl_defaults", False):
        del args["shuffle_dataset"], args["ignore_data_skip"]
    args.update(overrides)
    return GRPOConfig(**args)


class Scored:
    """The reward function's log: ``(attempt, global step when generated, key, uid)`` per
    completion; it raises :class:`Crash` once, generating at ``crash_at = (attempt, step)``."""

    def __init__(self, crash_at: tuple[int, int] | None = None) -> None:
        self.attempt, self.crash_at, self.rows = 1, crash_at, []
        self.wrap = lambda reward: reward  # what GRPOTrainer gets: the reward, or a recording wrapper of it

    def reward(self) -> Any:
        def accuracy(completions, ground_truth, key, trainer_state, **kwargs):
            if (self.attempt, trainer_state.global_step) == self.crash_at:
                raise Crash(f"simulated crash in attempt {self.attempt} generating for step {trainer_state.global_step + 1}")
            uids = kwargs.get("uid", [None] * len(key))
            self.rows += [(self.attempt, trainer_state.global_step, k, tuple(u) if u else None) for k, u in zip(key, uids)]
            return [math_reward(c[0]["content"], truth) for c, truth in zip(completions, ground_truth)]

        return accuracy

    def steps_trained(self, checkpoint: int, window_steps: int = 1, max_steps: int = STEPS) -> Counter:
        """Optimizer steps that trained each prompt (key) in the surviving history: a window
        generated at step g trains steps g+1 .. g+window_steps; attempt 1's steps up to
        ``checkpoint`` survive (the resumed model holds them), then attempt 2's up to ``max_steps``."""
        windows = {(attempt, step, key) for attempt, step, key, _ in self.rows}
        trained: Counter = Counter()
        for attempt, step, key in windows:
            last = checkpoint if attempt == 1 else max_steps
            trained[key] += len([s for s in range(step + 1, step + window_steps + 1) if s <= last])
        return trained

    def uids(self, checkpoint: int) -> Counter:
        """Surviving windows per uid (attempt 1's windows that ended by ``checkpoint``, then attempt 2's)."""
        windows = {(a, s, u) for a, s, _, u in self.rows if a == 2 or s + 1 <= checkpoint}
        return Counter(uid for _, _, uid in windows)


def _trainer(tokenizer: Any, args: Any, dataset: Any, scored: Scored, callbacks: list[Any]) -> Any:
    from trl import GRPOTrainer

    return GRPOTrainer(model=_policy(tokenizer), reward_funcs=[scored.wrap(scored.reward())], args=args,
                       train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks)  # fmt: skip


def _crash_then_resume(tokenizer: Any, args: Any, scored: Scored, make_dataset: Any) -> int:
    """Train until :class:`Crash`, then a new trainer resumes from the last checkpoint and trains
    to ``max_steps``; returns the checkpoint's step. ``make_dataset()``: ``(dataset, callbacks)``."""
    dataset, callbacks = make_dataset()
    with pytest.raises(Crash):
        _trainer(tokenizer, args, dataset, scored, callbacks).train()
    checkpoint = max(int(p.name.split("-")[1]) for p in Path(args.output_dir).glob("checkpoint-*"))
    scored.attempt = 2
    dataset, callbacks = make_dataset()
    _trainer(tokenizer, args, dataset, scored, callbacks).train(resume_from_checkpoint=True)
    return checkpoint


def _rows() -> list[dict[str, Any]]:
    """The same prompts as plain TRL rows (what a user without rl_data would train on)."""
    return [{"prompt": [{"role": "user", "content": row["question"]}], "key": key,
             "ground_truth": ground_truth_from_gsm8k_answer(row["answer"])} for key, row in zip(KEYS, _problems())]  # fmt: skip


def _replayable_stream() -> Any:
    from datasets import IterableDataset

    return IterableDataset.from_generator(lambda: iter(_rows()))


def _queue_stream(pulled: list[str]) -> Any:
    """An IterableDataset over a source that goes on where it stopped (a queue, a live stream)."""
    from datasets import IterableDataset

    source = iter(_rows())

    def rows() -> Iterator[dict[str, Any]]:
        for row in source:
            pulled.append(row["key"])
            yield row

    return IterableDataset.from_generator(rows)


def _missed_and_repeated(trained: Counter, window_steps: int = 1) -> tuple[list[str], list[str]]:
    """Prompts trained in fewer / more optimizer steps than one generation window has."""
    return ([k for k in KEYS if trained[k] < window_steps], [k for k in KEYS if trained[k] > window_steps])


@pytest.mark.timeout(600)
def test_a_crashed_grpo_run_resumes_and_trains_every_prompt_once_beside_trls_own_resume(
    shared_feed, trl_tokenizer, tmp_path
):
    # rl_data: attempt 1 saves at step 2, trains step 3 and dies generating for step 4
    scored, feed = Scored(crash_at=(1, 3)), shared_feed.rewound()

    def feed_dataset() -> tuple[Any, list[Any]]:
        source = TRLPromptFeed(feed, reward_funcs=[scored.reward()], timeout_s=TIMEOUT_S)
        scored.wrap = lambda reward: source.record_outcomes(reward, correct_at=1.0)  # acks carry each prompt's Outcome
        return source.train_dataset, [source.callback]

    checkpoint = _crash_then_resume(trl_tokenizer, _grpo_config(tmp_path / "feed"), scored, feed_dataset)
    status = _status(feed)
    history = PromptHistory.from_state(ray.get(feed.state_dict.remote(), timeout=TIMEOUT_S)["ledger"]["history"])
    assert status["history"]["prompts"] == PROMPTS  # one Outcome per prompt, the rolled-back ones once
    assert {history.get(key).generated for key in KEYS} == {2} and {history.get(key).tries for key in KEYS} == {1}

    assert checkpoint == 2
    trained = scored.steps_trained(checkpoint)
    assert _missed_and_repeated(trained) == ([], []) and sorted(trained) == KEYS
    assert sorted(scored.uids(checkpoint).items()) == [(Uid(0, p), 1) for p in range(PROMPTS)]
    rolled_back = {uid for attempt, step, _, uid in scored.rows if attempt == 1 and step >= checkpoint}
    assert rolled_back == {(0, 4), (0, 5)}  # step 3 ran past the checkpoint: trained again after the resume
    epoch = status["epochs"][0]
    assert (epoch["size"], epoch["acked"], epoch["resolved_exactly_once"]) == (PROMPTS, PROMPTS, True)
    assert status["outstanding"] == 0  # what the last run took ahead was released at its end
    chain = {step: load_checkpoint_file(checkpoint_path(tmp_path / "feed" / f"checkpoint-{step}" / FEED_FOLDER))
             for step in (2, 4, 6)}  # fmt: skip
    assert {step: state["ledger"]["epochs"][0]["acked"] for step, state in chain.items()} == {2: 4, 4: 8, 6: 12}

    # TRL's own resume, same prompts, same crash, TRL's default settings: a Dataset, and a stream
    # that goes on where it stopped (a queue; the feed without this adapter)
    scored = Scored(crash_at=(1, 3))
    checkpoint = _crash_then_resume(trl_tokenizer, _grpo_config(tmp_path / "dataset", trl_defaults=True), scored,
                                    lambda: (__import__("datasets").Dataset.from_list(_rows()), []))  # fmt: skip
    missed, repeated = _missed_and_repeated(scored.steps_trained(checkpoint))
    assert (checkpoint, missed, repeated) == (2, [], [])  # re-read from the start, the trained batches skipped
    pulled: list[str] = []
    queue = _queue_stream(pulled)
    scored = Scored(crash_at=(1, 3))
    checkpoint = _crash_then_resume(trl_tokenizer, _grpo_config(tmp_path / "queue", trl_defaults=True), scored,
                                    lambda: (queue, []))  # fmt: skip
    missed, repeated = _missed_and_repeated(scored.steps_trained(checkpoint))
    print(f"TRL's own resume over a queue: {len(missed)} of {PROMPTS} prompts never trained, {len(repeated)} repeated")
    # attempt 1 read 10 prompts (steps 1-4 and one window ahead); the 2 of step 3 are rolled back with
    # the model, the 4 read ahead are gone; the resumed Trainer skips 2 steps (4 prompts) of what is
    # left (2): nothing remains to train
    assert (checkpoint, len(missed), repeated, len(pulled)) == (2, 8, [], PROMPTS)
    assert sorted(set(KEYS) - set(missed)) == sorted({key for a, step, key, _ in scored.rows if a == 1 and step < 2})


class CrashAfter:
    """A callback that raises :class:`Crash` at the end of optimizer step ``step`` (attempt 1 only)
    and records how many prompts of the feed's first epoch were acked at each step end."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from transformers import TrainerCallback

        class _CrashAfter(TrainerCallback):
            def __init__(self, step: int | None, feed: Any = None) -> None:
                self.step, self.feed, self.acked = step, feed, {}

            def on_step_end(self, args, state, control, **kwargs):
                if self.feed is not None:
                    self.acked[state.global_step] = _status(self.feed)["epochs"][0]["acked"]
                if state.global_step == self.step:
                    raise Crash(f"simulated crash after step {self.step}")

        return _CrashAfter(*args, **kwargs)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_window_of_two_steps_is_acked_after_its_last_step_and_resumes_whole(
    shared_feed, trl_tokenizer, tmp_path
):
    """steps_per_generation=2: 4 prompts generated at once, trained over 2 optimizer steps."""
    window = dict(steps_per_generation=2)
    scored, feed = Scored(), shared_feed.rewound()
    taken = _status(feed)["totals"]["taken"]
    with pytest.raises(ValueError, match=r"save_steps=3 saves inside generation windows of 2 optimizer steps"):
        source = TRLPromptFeed(feed, reward_funcs=[scored.reward()], timeout_s=TIMEOUT_S)
        _trainer(trl_tokenizer, _grpo_config(tmp_path / "refused", save_steps=3, **window), source.train_dataset,
                 scored, [source.callback]).train()  # fmt: skip
    assert scored.rows == [] and _status(feed)["totals"]["taken"] == taken  # refused before any prompt was taken

    crash = CrashAfter(3, feed)  # in the middle of the second window

    def feed_dataset() -> tuple[Any, list[Any]]:
        source = TRLPromptFeed(feed, reward_funcs=[scored.reward()], timeout_s=TIMEOUT_S)
        return source.train_dataset, [source.callback] + ([crash] if scored.attempt == 1 else [])

    checkpoint = _crash_then_resume(trl_tokenizer, _grpo_config(tmp_path / "feed", **window), scored, feed_dataset)
    status = _status(feed)

    assert checkpoint == 2 and crash.acked == {1: 0, 2: 4, 3: 4}  # acked when a window's last step is done
    trained = scored.steps_trained(checkpoint, window_steps=2)
    assert _missed_and_repeated(trained, window_steps=2) == ([], []) and sorted(trained) == KEYS
    assert (status["epochs"][0]["acked"], status["epochs"][0]["resolved_exactly_once"]) == (PROMPTS, True)
    chain = {step: load_checkpoint_file(checkpoint_path(tmp_path / "feed" / f"checkpoint-{step}" / FEED_FOLDER))
             for step in (2, 4, 6)}  # fmt: skip
    assert {step: state["ledger"]["epochs"][0]["acked"] for step, state in chain.items()} == {2: 4, 4: 8, 6: 12}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_trls_own_resume_of_a_replayable_stream_and_inside_a_window(trl_tokenizer, tmp_path):
    """The rest of the comparison with TRL's own resume (no rl_data; slow: two more crashed runs)."""
    scored = Scored(crash_at=(1, 3))  # the main test's crash, over an IterableDataset that replays its rows
    checkpoint = _crash_then_resume(trl_tokenizer, _grpo_config(tmp_path / "stream", trl_defaults=True), scored,
                                    lambda: (_replayable_stream(), []))  # fmt: skip
    assert (checkpoint, *_missed_and_repeated(scored.steps_trained(checkpoint))) == (2, [], [])

    # steps_per_generation=2 and a checkpoint inside a window (save_steps=3, which rl_data refuses)
    scored, crash = Scored(), CrashAfter(4)
    checkpoint = _crash_then_resume(
        trl_tokenizer, _grpo_config(tmp_path / "window", save_steps=3, steps_per_generation=2, trl_defaults=True),
        scored, lambda: (__import__("datasets").Dataset.from_list(_rows()), [crash] if scored.attempt == 1 else []),
    )  # fmt: skip
    missed, repeated = _missed_and_repeated(scored.steps_trained(checkpoint, window_steps=2), window_steps=2)
    print(f"TRL's own resume inside a window: {len(repeated)} prompts trained more than a window, {len(missed)} less")
    # the interrupted window's 4 prompts: 1 step before the checkpoint, then a new whole window after
    # it; the windows after it shift by a step, so the last 4 prompts get 1 step before max_steps
    assert (checkpoint, len(repeated), len(missed)) == (3, 4, 4)


_PROCESS = textwrap.dedent(
    """
    import json, os, sys
    import ray
    address, name, namespace, output = sys.argv[1:5]
    ray.init(address=address, namespace=namespace, log_to_driver=False)
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl import GRPOConfig, GRPOTrainer
    from rl_data.integrations.trl import TRLPromptFeed
    from rl_data.rewards import math_reward
    from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

    tokenizer = load_qwen3_tokenizer()

    def train(max_steps, resume):
        scored, keys = [], set()

        def accuracy(completions, ground_truth, uid, trainer_state, **kwargs):
            scored.extend([trainer_state.global_step, list(u)] for u in uid)
            keys.update(kwargs["key"])
            return [math_reward(c[0]["content"], truth) for c, truth in zip(completions, ground_truth)]

        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                             tie_word_embeddings=True))
        source = TRLPromptFeed(name, namespace=namespace, reward_funcs=[accuracy], timeout_s=60)
        args = GRPOConfig(output_dir=output, use_cpu=True, bf16=False, seed=0, report_to=[], disable_tqdm=True,
                          logging_steps=1000, per_device_train_batch_size=2, num_generations=2, max_completion_length=4,
                          max_steps=max_steps, save_steps=2, shuffle_dataset=False, ignore_data_skip=True)
        recorded = source.record_outcomes(accuracy, correct_at=1.0)  # each process records its own completions
        trainer = GRPOTrainer(model=model, reward_funcs=[recorded], args=args, train_dataset=source.train_dataset,
                              processing_class=tokenizer, callbacks=[source.callback])
        trainer.train(resume_from_checkpoint=resume or None)
        with open(os.path.join(output, f"scored-{resume and 'resumed'}-{args.process_index}.json"), "w") as f:
            json.dump({"scored": scored, "keys": sorted(keys), "taken": source.counts["taken"], "processes": args.world_size}, f)

    train(3, "")  # stops after step 3, as if it crashed there
    train(4, os.path.join(output, "checkpoint-2"))  # a new trainer and source resume from step 2
    """
)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_accelerate_processes_share_one_feed_and_resume_each_prompt_once(shared_feed, ray_session, tmp_path):
    """torchrun, 2 CPU processes (gloo): process 0 takes each window and broadcasts it, every
    process trains its slice; then both resume from checkpoint-2 (as after a crash after step 3)."""
    import json
    import os
    import subprocess
    import sys

    script, feed = tmp_path / "process.py", shared_feed.rewound()
    script.write_text(_PROCESS)
    env = dict(os.environ, RAY_AUTH_MODE="token", PYTHONPATH=str(Path(__file__).parents[1]))
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
         ray_session.get_runtime_context().gcs_address, shared_feed.config.name, NAMESPACE, str(tmp_path)],
        capture_output=True, text=True, timeout=400, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    status = _status(feed)
    runs = {(resumed, rank): json.loads((tmp_path / f"scored-{resumed}-{rank}.json").read_text())
            for resumed in ("", "resumed") for rank in (0, 1)}  # fmt: skip
    assert {key: (r["taken"] > 0, r["processes"]) for key, r in runs.items()} == {
        ("", 0): (True, 2), ("", 1): (False, 2), ("resumed", 0): (True, 2), ("resumed", 1): (False, 2)}
    # every process trained its own slice: each step's 2 prompts, one per process
    windows = {(resumed, step, tuple(uid), rank) for (resumed, rank), r in runs.items() for step, uid in r["scored"]}
    lineage = sorted((uid, rank) for resumed, step, uid, rank in windows if resumed or step < 2)
    assert [uid for uid, _ in lineage] == [(0, p) for p in range(8)]  # steps 1-2, then 3-4 again: once each
    assert {rank for uid, rank in lineage if uid[1] % 2} == {1} and {rank for uid, rank in lineage if not uid[1] % 2} == {0}
    assert (status["epochs"][0]["acked"], status["outstanding"]) == (8, 0)
    # the outcomes of both processes' completions reached the feed (process 0 gathers them): 2 samples a prompt
    history = PromptHistory.from_state(ray_session.get(feed.state_dict.remote(), timeout=TIMEOUT_S)["ledger"]["history"])
    assert status["history"]["prompts"] == 8
    keys = {key for r in runs.values() for key in r["keys"]}
    assert len(keys) == 8 and {(history.get(key).generated, history.get(key).tries) for key in keys} == {(2, 1)}


@pytest.fixture(scope="module")
def saved_run(shared_feed, trl_tokenizer, tmp_path_factory) -> Path:
    """A 2-step run on the shared feed with a checkpoint at step 2 (its output folder)."""
    output = tmp_path_factory.mktemp("trl_saved_run")
    scored = Scored()
    source = TRLPromptFeed(shared_feed.handle, reward_funcs=[scored.reward()], timeout_s=TIMEOUT_S)
    _trainer(trl_tokenizer, _grpo_config(output, max_steps=2), source.train_dataset, scored, [source.callback]).train()
    assert (output / "checkpoint-2" / FEED_FOLDER / "trl_callback.json").is_file()
    return output


def _resume(tokenizer: Any, feed: Any, output: Path, checkpoint: Path | None = None, scored: Scored | None = None) -> Scored:
    """Resume ``output``'s run on ``feed`` (from ``checkpoint`` when given); returns the reward log."""
    scored = scored or Scored()
    source = TRLPromptFeed(feed, reward_funcs=[scored.reward()], timeout_s=TIMEOUT_S,
                           resume_from=str(checkpoint) if checkpoint else None)  # fmt: skip
    trainer = _trainer(tokenizer, _grpo_config(output, max_steps=4), source.train_dataset, scored, [source.callback])
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else True)
    return scored


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_checkpoint_of_another_dataset_task_or_layout_is_refused_before_any_step(
    ray_session, prompt_root, saved_run, trl_tokenizer, tmp_path
):
    def assert_refused(feed: Any, message: str) -> None:
        scored = Scored()
        with pytest.raises(ValueError, match=message):
            _resume(trl_tokenizer, feed, saved_run, scored=scored)
        assert scored.rows == [] and _status(feed)["totals"] == {"taken": 0, "acked": 0, "dropped": 0, "released": 0}
        assert sorted(p.name for p in saved_run.glob("checkpoint-*")) == ["checkpoint-2"]  # no step ran

    # other prompts and another task setting: both differences listed
    other = _spec(_write_prompts(tmp_path / "other_prompts", seed=1), generation_padding="left")
    with running_feed(ray_session, other) as feed:
        assert_refused(feed, r"rank 0: Energon loader identity changed: .*dataset\.index_uuid"
                             r".*task\.config\.generation_padding 'none' -> 'left'")
    # the prompts over one rank, in a window of 4 prompts (what the resumed trainer takes ahead: 2 windows of 2)
    with running_feed(ray_session, _spec(prompt_root), world=1, max_outstanding=4) as feed:
        assert_refused(feed, r"Placement layout changed: .*logical_world_size 2 -> 1")
        # a trainer that takes 2 windows of 4 prompts ahead: refused at the start
        source = TRLPromptFeed(feed, timeout_s=TIMEOUT_S, columns=["ground_truth"])
        with pytest.raises(ValueError, match=r"lets 4 prompts be outstanding .*set max_outstanding >= 8"):
            _trainer(trl_tokenizer, _grpo_config(tmp_path / "small", per_device_train_batch_size=8),
                     source.train_dataset, Scored(), [source.callback]).train()  # fmt: skip


@pytest.mark.timeout(300)
def test_a_checkpoint_without_the_feeds_state_is_refused_never_taken_for_a_fresh_start(
    shared_feed, saved_run, trl_tokenizer, tmp_path
):
    import json

    before = _status(shared_feed.handle)["totals"]
    cases = {name: tmp_path / name for name in ("no_feed_state", "no_callback_entry", "other_save")}
    for folder in cases.values():
        shutil.copytree(saved_run, folder)
    shutil.rmtree(cases["no_feed_state"] / "checkpoint-2" / FEED_FOLDER)
    trainer_state = cases["no_callback_entry"] / "checkpoint-2" / "trainer_state.json"
    state = json.loads(trainer_state.read_text())
    del state["stateful_callbacks"]["PromptFeedCallback"]
    trainer_state.write_text(json.dumps(state))
    marker = cases["other_save"] / "checkpoint-2" / FEED_FOLDER / "trl_callback.json"
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "token": "another-save"}))
    for name, error, message in (
        ("no_feed_state", FileNotFoundError, r"checkpoint-2 has no prompt feed state \(rl_data_prompt_feed/trl_callback.json\)"),
        ("no_callback_entry", ValueError, r"has no PromptFeedCallback entry: it was saved without TRLPromptFeed"),
        ("other_save", ValueError, r"holds the prompt feed state of another save \(token 'another-save', step 2\)"),
    ):  # fmt: skip
        with pytest.raises(error, match=message):
            _resume(trl_tokenizer, shared_feed.handle, cases[name])
    # resuming from a folder elsewhere than output_dir/checkpoint-<step> needs resume_from
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(saved_run / "checkpoint-2", elsewhere)
    scored = Scored()
    source = TRLPromptFeed(shared_feed.handle, reward_funcs=[scored.reward()], timeout_s=TIMEOUT_S)
    trainer = _trainer(trl_tokenizer, _grpo_config(tmp_path / "fresh_output", max_steps=4), source.train_dataset,
                       scored, [source.callback])  # fmt: skip
    with pytest.raises(FileNotFoundError, match=r"pass TRLPromptFeed\(\.\.\., resume_from=<that folder>\)"):
        trainer.train(resume_from_checkpoint=str(elsewhere))
    assert scored.rows == []
    assert _status(shared_feed.handle)["totals"] == before  # nothing taken, nothing restored
    scored = _resume(trl_tokenizer, shared_feed.handle, tmp_path / "fresh_output", checkpoint=elsewhere)
    assert len({(step, key) for _, step, key, _ in scored.rows}) == 4  # steps 3 and 4, 2 prompts each


@pytest.mark.timeout(300)
def test_rows_lacking_a_reward_column_fail_at_the_first_batch_naming_it(shared_feed, trl_tokenizer, tmp_path):
    from trl import GRPOTrainer

    def by_answer(completions, answer_key, **kwargs):  # a column the prompts do not have
        return [0.0] * len(completions)

    before = _status(shared_feed.handle)
    source = TRLPromptFeed(shared_feed.handle, reward_funcs=[by_answer], timeout_s=TIMEOUT_S)
    trainer = GRPOTrainer(model=_policy(trl_tokenizer), reward_funcs=[by_answer], args=_grpo_config(tmp_path),
                          train_dataset=source.train_dataset, processing_class=trl_tokenizer, callbacks=[source.callback])  # fmt: skip
    with pytest.raises(ValueError, match=r"reward function by_answer needs column 'answer_key', but prompt \(\d+, \d+\)"):
        trainer.train()
    after = _status(shared_feed.handle)
    assert after["outstanding"] == 0 and not list(tmp_path.glob("checkpoint-*"))
    assert after["totals"]["released"] - before["totals"]["released"] == 2  # the first window, given back


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"shuffle_dataset": True}, r"shuffle_dataset=True: .* set shuffle_dataset=False"),
        ({"ignore_data_skip": False}, r"ignore_data_skip=False: .* set ignore_data_skip=True"),
        ({"restore_callback_states_from_checkpoint": True}, r"restore_callback_states_from_checkpoint=True .* set it False"),
        ({"steps_per_generation": 3, "gradient_accumulation_steps": 2}, r"a window must span whole optimizer steps"),
    ],
)
def test_settings_that_would_lose_or_repeat_prompts_are_refused_before_a_prompt_is_taken(
    shared_feed, trl_tokenizer, tmp_path, setting, message
):
    before = _status(shared_feed.handle)["totals"]
    source = TRLPromptFeed(shared_feed.handle, columns=["ground_truth"], timeout_s=TIMEOUT_S)
    with pytest.raises(ValueError, match=message):
        _trainer(trl_tokenizer, _grpo_config(tmp_path, **setting), source.train_dataset, Scored(), [source.callback]).train()
    assert _status(shared_feed.handle)["totals"] == before


def test_the_dataset_refuses_to_run_without_its_callback(shared_feed, trl_tokenizer, tmp_path):
    source = TRLPromptFeed(shared_feed.handle, columns=["ground_truth"], timeout_s=TIMEOUT_S)
    with pytest.raises(RuntimeError, match=r"iterated before its callback's on_train_begin: pass callbacks=\[source.callback\]"):
        _trainer(trl_tokenizer, _grpo_config(tmp_path), source.train_dataset, Scored(), []).train()


# -- the adapter's pure parts ----------------------------------------------------------------


def test_reward_columns_are_the_parameters_trl_does_not_pass_itself():
    def accuracy(prompts, completions, ground_truth, trainer_state, log_extra=None, **kwargs): ...

    def length(completions, completion_ids, **kwargs): ...

    def judge(completions, rubric, weight=1.0, *args): ...

    assert reward_columns([accuracy, length, judge, "org/reward-model"]) == {"ground_truth": ["accuracy"], "rubric": ["judge"]}


def test_a_row_holds_the_conversational_prompt_uid_key_and_the_lifted_columns():
    messages = [{"role": "user", "content": "What is 3 * 6?"}]
    prompt = TakenPrompt(Uid(1, 7), "prompt-007", {"messages": messages, "extra_env_info": {"ground_truth": "18"},
                                                   "task_name": "math", "message_log": ["..."]})  # fmt: skip
    assert prompt_row(prompt, {"ground_truth": ["accuracy"]}) == {
        "prompt": messages, "uid": [1, 7], "key": "prompt-007", "task_name": "math",
        "extra_env_info": {"ground_truth": "18"}, "ground_truth": "18",
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"reward function judge needs column 'rubric', but prompt \(1, 7\) .* extra_env_info has \['ground_truth'\]"):
        prompt_row(prompt, {"rubric": ["judge"]})
    templated = TakenPrompt(Uid(0, 0), "k", {"message_log": [], "extra_env_info": {}})
    with pytest.raises(ValueError, match=r"no 'messages' column .* set data_config\['task'\]\['prompt_messages'\] = True"):
        prompt_row(templated, {})


def test_the_window_arithmetic_of_grpo(tmp_path):
    plain = check_settings(_grpo_config(tmp_path))  # 2 prompts a step, one step a window
    assert plain == GenerationWindow(prompts=2, micro_steps=1, accumulation=1)
    assert [plain.trained(s) for s in range(4)] == [0, 2, 4, 6] and plain.held_before_first_ack() == 4
    two_steps = check_settings(_grpo_config(tmp_path, steps_per_generation=2))
    assert [two_steps.trained(s) for s in range(5)] == [0, 0, 4, 4, 8] and two_steps.held_before_first_ack() == 8
    assert [two_steps.ends_a_window(s) for s in range(4)] == [True, False, True, False]
    reused = check_settings(_grpo_config(tmp_path, num_iterations=2, save_steps=4))  # each window trained twice
    assert [reused.trained(s) for s in range(5)] == [0, 0, 2, 2, 4]
    accumulated = check_settings(_grpo_config(tmp_path, gradient_accumulation_steps=2, steps_per_generation=1))
    assert [accumulated.trained(s) for s in range(3)] == [0, 4, 8] and accumulated.held_before_first_ack() == 6
    with pytest.raises(ValueError, match=r"TRLPromptFeed works with TRL's GRPOTrainer: its arguments \(TrainingArguments\)"):
        from transformers import TrainingArguments

        check_settings(TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to=[]))
