"""TRL (``GRPOTrainer``): the prompt feed as TRL's train dataset, each prompt trained exactly once::

    from rl_data.integrations.trl import TRLPromptFeed

    source = TRLPromptFeed(feed, reward_funcs=[accuracy])      # feed: the PromptFeed's handle or name
    trainer = GRPOTrainer(model=model, reward_funcs=[accuracy], processing_class=tokenizer,
                          args=GRPOConfig(..., shuffle_dataset=False, ignore_data_skip=True),
                          train_dataset=source.train_dataset, callbacks=[source.callback])
    trainer.train()             # after a crash: a new trainer and source, train(resume_from_checkpoint=True)

Only TRL's and transformers' public extension points are used (an ``IterableDataset`` and a
``TrainerCallback``); nothing of either is patched. The rules:

* **Rows.** One row per prompt, in uid order as the feed hands them out: ``prompt`` (the
  conversational form, from the ``messages`` column the ``rl_prompt`` task adds with
  ``data_config["task"]["prompt_messages"] = True``), ``uid`` (``[epoch, position]``), ``key`` (the
  sample key), ``task_name``, ``extra_env_info``, and every column a reward function names (its
  parameters without a default, except those TRL passes itself), taken from ``extra_env_info``
  (e.g. ``ground_truth``). A prompt without such a column fails the batch it is in, naming the
  column and the reward function (its window's prompts are released first). ``columns=`` adds
  columns for reward functions that read ``**kwargs``. The stream never ends: feed epochs follow
  each other; ``GRPOConfig.max_steps`` ends training.
* **Generation windows.** TRL generates for ``generation_batch_size // num_generations = B``
  prompts at once and trains on those completions for ``W = steps_per_generation x
  num_iterations`` micro-steps (``gradient_accumulation_steps = G`` per optimizer step); the
  stream's prompts ``[w B, (w+1) B)`` (counted from the start of ``train()``) are window w.
* **Trained.** A prompt counts as trained, and is acked, when the optimizer step that holds the
  last micro-step of its window is done (``on_step_end``). Prompts taken ahead (TRL's dataloader
  prefetches up to ``ceil(G/W) + 1`` windows) stay outstanding; at the end of ``train()`` they are
  released (handed out again first). The feed must let the trainer hold that many:
  ``FeedConfig.max_outstanding >= B x (ceil(G/W) + 1)``, checked at the start.
* **Checkpoints.** ``on_save`` writes the feed's state (fetched from the feed, written by the
  trainer's process: no filesystem shared with the feed's node needed) into
  ``<checkpoint>/rl_data_prompt_feed/`` after transformers wrote the trainer's files, then a
  marker whose token matches the callback's entry in that checkpoint's ``trainer_state.json``.
  Every prompt not acked at that step (outstanding, prefetched) is handed out again on resume.
  A checkpoint inside a window (W > G and a save step that is no window end) counts the
  window's prompts as untrained: a resume generates and trains them for a whole window again
  (the window's steps before the checkpoint stay in the model); a warning says so, and
  ``save_steps`` must be a multiple of the window's ``W / G`` optimizer steps.
* **Resume.** ``state.global_step > 0`` at ``on_train_begin`` means transformers loaded a
  checkpoint; the callback finds its folder (``output_dir/checkpoint-<global_step>``, or
  ``resume_from=``), checks the marker's token against the loaded trainer state and restores the
  feed (a live feed is rewound, see :meth:`PromptFeed.load_state_dict`). A checkpoint without the
  feed's state, with another save's state, or whose state belongs to another dataset, task or
  layout (the feed's usual list of differences) is refused before any step. A fresh start
  releases what an earlier trainer with the same ``holder`` left outstanding.
* **Settings** refused at ``on_train_begin``, naming the fix: ``shuffle_dataset=True`` (a
  1000-prompt buffer taken ahead and reordered; the feed shuffles already), ``ignore_data_skip=False``
  (on resume the Trainer would read and discard ``global_step x G`` batches: prompts taken and
  never trained), windows that neither span whole optimizer steps nor divide one, a too small
  feed window, ``restore_callback_states_from_checkpoint=True`` (it rebuilds callbacks from JSON),
  more than one ``TRLPromptFeed`` in a trainer.
* **Outcomes.** ``source.record_outcomes(reward_func, correct_at=1.0)`` wraps a reward function
  (give the wrapper to GRPOTrainer): it returns the same rewards and records them per prompt
  (``uid`` column), and each prompt is acked with its ``Outcome`` (``Outcome.from_rewards`` of its
  group's rewards, in [0, 1]) for the feed's schedule. With several processes, each records its
  own completions' rewards and process 0 gathers them at every optimizer step.
* **Several processes** (accelerate, ``dispatch_batches`` forced off by TRL for iterable data):
  every process iterates the same global stream and keeps its slice (accelerate's
  ``IterableDatasetShard``). Process 0 alone takes each window's prompts from the feed and
  broadcasts the rows to the others (``torch.distributed.broadcast_object_list``); process 0
  alone acks, saves and restores. Tested with 2 CPU processes (``torchrun``, gloo), not on GPUs.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import os
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from transformers.trainer_callback import ExportableState, TrainerCallback

from rl_data.distributed.checkpoint_files import checkpoint_path, load_checkpoint_file, save_checkpoint_file
from rl_data.distributed.config import DEFAULT_NAMESPACE

logger = logging.getLogger(__name__)

#: Folder of the feed's state inside a TRL checkpoint folder, and the marker written last.
FEED_FOLDER = "rl_data_prompt_feed"
MARKER_FILE = "trl_callback.json"
MARKER_FORMAT, MARKER_VERSION = "rl_data.integrations.trl", 1
#: Keyword arguments GRPOTrainer passes to every reward function itself (not row columns).
TRL_REWARD_ARGUMENTS = frozenset(
    {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments"}
)
ROW_COLUMNS = ("prompt", "uid", "key", "task_name", "extra_env_info")


def reward_columns(reward_funcs: Sequence[Any]) -> dict[str, list[str]]:
    """``{column: [reward functions needing it]}``: each Python reward function's parameters
    without a default, except what TRL passes itself (model names and reward models need none)."""
    needed: dict[str, list[str]] = {}
    for func in reward_funcs:
        if isinstance(func, str) or not callable(func) or hasattr(func, "forward"):
            continue
        try:
            parameters = inspect.signature(func).parameters.values()
        except (TypeError, ValueError):
            continue
        for parameter in parameters:
            if (
                parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)
                or parameter.default is not parameter.empty
                or parameter.name in TRL_REWARD_ARGUMENTS
            ):
                continue
            needed.setdefault(parameter.name, []).append(getattr(func, "__name__", type(func).__name__))
    return needed


def prompt_row(prompt: Any, columns: dict[str, list[str]]) -> dict[str, Any]:
    """The TRL row of a :class:`~rl_data.TakenPrompt` (see the module doc)."""
    payload = prompt.payload
    where = f"prompt {tuple(prompt.uid)} (key {prompt.key!r})"
    if payload.get("messages") is None:
        raise ValueError(
            f"{where} has no 'messages' column (its columns: {sorted(payload)}); TRL takes conversational "
            "prompts: set data_config['task']['prompt_messages'] = True in the feed's LoaderSpec"
        )
    env = payload.get("extra_env_info") or {}
    row = {"prompt": payload["messages"], "uid": list(prompt.uid), "key": prompt.key,
           "task_name": payload.get("task_name"), "extra_env_info": env}  # fmt: skip
    for column, users in columns.items():
        if column in row:
            continue
        if column not in env:
            raise ValueError(
                f"reward function {', '.join(users)} needs column {column!r}, but {where} has none: its row "
                f"has {list(ROW_COLUMNS)} and its extra_env_info has {sorted(env)}; store {column!r} in the "
                "prompts' extra_env_info (preprocess keeps an extra_env_info column), or give the reward "
                "function's parameter a default"
            )
        row[column] = env[column]
    return row


@dataclass(frozen=True)
class GenerationWindow:
    """How GRPOTrainer consumes the stream: ``prompts`` per window, trained for ``micro_steps``
    micro-steps, ``accumulation`` micro-steps per optimizer step."""

    prompts: int
    micro_steps: int
    accumulation: int

    @classmethod
    def of(cls, args: Any) -> "GenerationWindow":
        return cls(
            prompts=args.generation_batch_size // args.num_generations,
            micro_steps=args.steps_per_generation * args.num_iterations,
            accumulation=args.gradient_accumulation_steps,
        )

    def trained(self, optimizer_steps: int) -> int:
        """Prompts of the stream whose window is done after ``optimizer_steps`` steps."""
        return optimizer_steps * self.accumulation // self.micro_steps * self.prompts

    def held_before_first_ack(self) -> int:
        """Prompts the trainer takes before it acks any (its dataloader prefetches)."""
        return self.prompts * (math.ceil(self.accumulation / self.micro_steps) + 1)

    def ends_a_window(self, optimizer_steps: int) -> bool:
        return optimizer_steps * self.accumulation % self.micro_steps == 0

    def problems(self, args: Any, save_steps: int) -> list[str]:
        """The settings this window cannot run with (empty: fine)."""
        found = []
        if self.micro_steps % self.accumulation and self.accumulation % self.micro_steps:
            found.append(
                f"steps_per_generation x num_iterations = {self.micro_steps} micro-steps per generation window and "
                f"gradient_accumulation_steps = {self.accumulation}: a window must span whole optimizer steps or "
                "an optimizer step whole windows; make one a multiple of the other"
            )
        elif self.micro_steps > self.accumulation and args.save_strategy == "steps":
            steps = self.micro_steps // self.accumulation
            if save_steps % steps:
                found.append(
                    f"save_steps={save_steps} saves inside generation windows of {steps} optimizer steps "
                    f"(steps_per_generation x num_iterations / gradient_accumulation_steps); set save_steps to a "
                    f"multiple of {steps}"
                )
        return found


def check_settings(args: Any) -> GenerationWindow:
    """Refuse (``ValueError``) trainer settings under which prompts would be lost or repeated."""
    missing = [n for n in ("num_generations", "steps_per_generation", "num_iterations", "generation_batch_size")
               if getattr(args, n, None) is None]  # fmt: skip
    if missing:
        raise ValueError(
            f"TRLPromptFeed works with TRL's GRPOTrainer: its arguments ({type(args).__name__}) lack {missing}; "
            "pass a trl.GRPOConfig"
        )
    window = GenerationWindow.of(args)
    problems = []
    if args.shuffle_dataset:
        problems.append(
            "shuffle_dataset=True: TRL would take 1000 prompts ahead into a shuffle buffer and reorder them; "
            "the feed shuffles already (Energon): set shuffle_dataset=False"
        )
    if not args.ignore_data_skip:
        problems.append(
            "ignore_data_skip=False: on resume the Trainer would read and discard global_step x "
            "gradient_accumulation_steps batches, prompts taken from the feed and never trained; the feed "
            "restores its own position: set ignore_data_skip=True"
        )
    if getattr(args, "restore_callback_states_from_checkpoint", False):
        problems.append(
            "restore_callback_states_from_checkpoint=True rebuilds callbacks from trainer_state.json, which "
            "cannot hold a live prompt feed: set it False (the callback restores the feed itself)"
        )
    save_steps = args.save_steps if args.save_steps >= 1 else math.ceil(args.max_steps * args.save_steps)
    problems += window.problems(args, int(save_steps))
    if problems:
        raise ValueError("TRLPromptFeed cannot train with these GRPOConfig settings: " + "; ".join(problems))
    return window


def _broadcast(value: Any) -> Any:
    """Process 0's ``value`` on every process (``torch.distributed``)."""
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _warn_if_checkpoints(output_dir: str) -> None:
    """A start at step 0 beside checkpoints: a resume whose checkpoint lacked trainer_state.json
    (transformers then starts at step 0) looks like a fresh start; say so."""
    found = sorted(p.name for p in Path(output_dir).glob("checkpoint-*")) if os.path.isdir(output_dir) else []
    if found:
        logger.warning(
            "training starts at step 0 although %s holds %s: if you meant to resume, the checkpoint had no "
            "trainer_state.json and transformers started over; the prompt feed goes on where it stands",
            output_dir, found,
        )


class _Run:
    """One ``train()`` call: its window, processes, start step and the stream taken so far."""

    def __init__(self, window: GenerationWindow, args: Any, start_step: int) -> None:
        self.window, self.start_step = window, start_step
        self.process, self.processes = args.process_index, args.world_size
        self.unacked: deque[Any] = deque()  # uids taken and not acked, in stream order
        self.acked = 0  # stream positions acked
        self.feed_window = 0  # the feed's max_outstanding (process 0)


class TRLPromptFeed:
    """The prompt feed as a GRPOTrainer train dataset (``train_dataset``) and its ``callback``."""

    def __init__(
        self,
        feed: Any,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        reward_funcs: Sequence[Any] = (),
        columns: Sequence[str] = (),
        holder: str = "trl-trainer",
        take_wait_s: float = 1.0,
        timeout_s: float = 600.0,
        resume_from: Optional[str] = None,
    ) -> None:
        """``feed``: a running :class:`~rl_data.prompt_feed.feed.PromptFeed`'s handle or name (in
        ``namespace``); ``reward_funcs``: those given to GRPOTrainer (their columns are checked);
        ``columns``: more ``extra_env_info`` keys to lift into columns; ``holder``: this trainer's
        name at the feed (unique per training job); ``resume_from``: the folder passed to
        ``train(resume_from_checkpoint=...)`` when it is not ``output_dir/checkpoint-<step>``."""
        from datasets import IterableDataset

        from rl_data.prompt_feed.client import RolloutClient, TrainerClient, get_feed

        handle = get_feed(feed, namespace) if isinstance(feed, str) else feed
        self.holder, self.resume_from = holder, resume_from
        self._rollout = RolloutClient(handle, timeout_s=timeout_s, holder=holder)
        self._trainer = TrainerClient(handle, timeout_s=timeout_s)
        self._take_wait_s, self._timeout_s = take_wait_s, timeout_s
        self.columns = reward_columns(reward_funcs)
        for column in columns:
            self.columns.setdefault(column, []).append("(columns=)")
        self.counts = {"taken": 0, "acked": 0, "released": 0}
        self._run: Optional[_Run] = None
        self._rewards: dict[tuple[int, int], list[float]] = {}  # uid -> rewards recorded (record_outcomes)
        self._correct_at: Optional[float] = None
        self._records_outcomes = False
        self.train_dataset = IterableDataset.from_generator(self._rows)
        self.callback = PromptFeedCallback(self)

    def record_outcomes(self, reward_func: Any, *, correct_at: Optional[float] = None) -> Any:
        """``reward_func`` wrapped to record each prompt's rewards (in [0, 1]; ``correct_at``: a
        reward at least this counts as right); pass the wrapper to GRPOTrainer. Each prompt is then
        acked with its ``Outcome``."""
        if self._records_outcomes:
            raise ValueError("record_outcomes was called twice: the outcome of a prompt comes from one reward function")
        self._records_outcomes, self._correct_at = True, correct_at

        @functools.wraps(reward_func)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            rewards = reward_func(*args, **kwargs)
            uids = kwargs.get("uid")
            if uids is None:
                raise ValueError("record_outcomes needs the rows' uid column: use it on TRLPromptFeed's train_dataset")
            for uid, reward in zip(uids, rewards):
                if reward is not None:
                    self._rewards.setdefault((int(uid[0]), int(uid[1])), []).append(float(reward))
            return rewards

        return recorded

    # -- the dataset -------------------------------------------------------------------------

    def _rows(self) -> Iterator[dict[str, Any]]:
        run = self._run
        if run is None:
            raise RuntimeError(
                "the TRLPromptFeed train_dataset was iterated before its callback's on_train_begin: pass "
                "callbacks=[source.callback] to the trainer, with train_dataset=source.train_dataset"
            )
        while True:
            yield from self._window_rows(run)

    def _window_rows(self, run: _Run) -> list[dict[str, Any]]:
        """The next window's rows: taken by process 0, broadcast to the others."""
        if run.processes == 1:
            return self._take_rows(run)
        if run.process != 0:
            kind, value = _broadcast(None)
        else:
            try:
                kind, value = "rows", self._take_rows(run)
            except BaseException as error:
                _broadcast(("error", f"{type(error).__name__}: {error}"))
                raise
            _broadcast((kind, value))
        if kind == "error":
            raise RuntimeError(f"process 0 could not take prompts from the feed: {value}")
        return value

    def _take_rows(self, run: _Run) -> list[dict[str, Any]]:
        prompts = self._take(run.window.prompts, run)
        try:
            rows = [prompt_row(prompt, self.columns) for prompt in prompts]
        except BaseException:
            self._release([p.uid for p in prompts])
            raise
        run.unacked.extend(p.uid for p in prompts)
        return rows

    def _take(self, n: int, run: _Run) -> list[Any]:
        taken: list[Any] = []
        deadline = time.monotonic() + self._timeout_s
        while len(taken) < n:
            taken += self._rollout.take(n - len(taken), wait_s=self._take_wait_s)
            if len(taken) < n and len(run.unacked) + len(taken) >= run.feed_window:
                self._release([p.uid for p in taken])
                raise RuntimeError(
                    f"this trainer holds {len(run.unacked)} unacked prompts and needs {n} more for a generation "
                    f"window, past the feed's max_outstanding={run.feed_window}: nothing can free room (acks come "
                    "after the window trains); raise FeedConfig.max_outstanding"
                )
            if len(taken) < n and time.monotonic() > deadline:
                self._release([p.uid for p in taken])
                status = self._rollout.status()
                raise TimeoutError(
                    f"the prompt feed handed out {len(taken)} of the {n} prompts of a generation window in "
                    f"{self._timeout_s:g} s: its window is full ({status['outstanding']} of max_outstanding "
                    f"{status['max_outstanding']} outstanding, by holder {status['outstanding_by_holder']}); this "
                    f"trainer holds {len(run.unacked)}: other consumers hold the rest, or raise FeedConfig.max_outstanding"
                )
        self.counts["taken"] += len(taken)
        return taken

    def _release(self, uids: list[Any]) -> None:
        if uids:
            self._rollout.release(uids)
            self.counts["released"] += len(uids)

    # -- the callback's work (process 0 talks to the feed) -------------------------------------

    def _begin(self, args: Any, state: Any) -> None:
        window = check_settings(args)
        if isinstance(state.stateful_callbacks.get(PromptFeedCallback.__name__), list):
            raise ValueError(
                "the trainer has several PromptFeedCallbacks (or the checkpoint holds several): one TRLPromptFeed "
                "per trainer; give it one feed"
            )
        run = _Run(window, args, state.global_step)
        error = None
        if run.process == 0:
            try:
                run.feed_window = self._check_feed_window(window)
                if state.global_step > 0:
                    self._restore(args, state)
                else:  # a fresh start: what an earlier trainer of this holder left is handed out again
                    _warn_if_checkpoints(args.output_dir)
                    self._trainer.release_holder(self.holder)
            except BaseException as failure:
                error = failure
        if run.processes > 1:
            message = _broadcast(None if error is None else f"{type(error).__name__}: {error}")
            if message is not None and error is None:
                raise RuntimeError(f"process 0 could not prepare the prompt feed: {message}")
        if error is not None:
            raise error
        self._run = run

    def _check_feed_window(self, window: GenerationWindow) -> int:
        limit, needed = self._rollout.status()["max_outstanding"], window.held_before_first_ack()
        if limit < needed:
            raise ValueError(
                f"the prompt feed lets {limit} prompts be outstanding (FeedConfig.max_outstanding), but this "
                f"trainer holds up to {needed} before its first ack ({window.prompts} prompts per generation "
                f"window, taken up to {needed // window.prompts} windows ahead); set max_outstanding >= {needed}"
            )
        return limit

    def _restore(self, args: Any, state: Any) -> None:
        step = state.global_step
        saved = state.stateful_callbacks.get(PromptFeedCallback.__name__)
        token = ((saved or {}).get("attributes") or {}).get("data_state_token") if isinstance(saved, dict) else None
        if token is None:
            raise ValueError(
                f"resuming at step {step} from a checkpoint whose trainer_state.json has no "
                f"{PromptFeedCallback.__name__} entry: it was saved without TRLPromptFeed, so where the prompt "
                "stream stood is unknown; resume from a checkpoint saved with it, or start a new run"
            )
        folder = Path(self.resume_from) if self.resume_from else Path(args.output_dir) / f"checkpoint-{step}"
        marker = folder / FEED_FOLDER / MARKER_FILE
        if not marker.is_file():
            raise FileNotFoundError(
                f"resuming at step {step}: {folder} has no prompt feed state ({FEED_FOLDER}/{MARKER_FILE}); the "
                "run may have stopped while saving it (the trainer's files are written first). Resume from an "
                f"earlier checkpoint, or delete {folder}; if you resume from another folder than "
                "output_dir/checkpoint-<step>, pass TRLPromptFeed(..., resume_from=<that folder>)"
            )
        found = json.loads(marker.read_text(encoding="utf-8"))
        if found.get("format") != MARKER_FORMAT or found.get("format_version") != MARKER_VERSION:
            raise ValueError(f"{marker} is not a {MARKER_FORMAT} v{MARKER_VERSION} marker: {found!r}")
        if found.get("token") != token:
            raise ValueError(
                f"{folder} holds the prompt feed state of another save (token {found.get('token')!r}, step "
                f"{found.get('global_step')}) than the trainer state being resumed (token {token!r}, step {step}); "
                "pass TRLPromptFeed(..., resume_from=<the folder given to resume_from_checkpoint>)"
            )
        self._trainer.load_state_dict(load_checkpoint_file(checkpoint_path(folder / FEED_FOLDER)))

    def _ack_trained(self, global_step: int) -> None:
        run = self._run
        if run is None:
            return
        if self._records_outcomes and run.processes > 1:
            self._gather_rewards(run)
        if run.process != 0:
            return
        target = run.window.trained(global_step - run.start_step)
        uids = [run.unacked.popleft() for _ in range(target - run.acked)]
        if uids:
            self._trainer.ack(uids, outcomes=self._outcomes(uids) if self._records_outcomes else None)
            run.acked = target
            self.counts["acked"] += len(uids)

    def _outcomes(self, uids: list[Any]) -> list[Any]:
        """Each uid's Outcome from its recorded rewards (None when none were recorded); forgets them."""
        from rl_data.prompt_feed.outcomes import Outcome

        outcomes = []
        for uid in uids:
            rewards = self._rewards.pop((int(uid[0]), int(uid[1])), None)
            outcomes.append(None if not rewards else Outcome.from_rewards(
                [min(1.0, max(0.0, r)) for r in rewards], correct_at=self._correct_at))  # fmt: skip
        return outcomes

    def _gather_rewards(self, run: _Run) -> None:
        """Every process's recorded rewards to process 0 (a collective: every process calls it each step)."""
        import torch.distributed as dist

        gathered: list[Any] = [None] * run.processes if run.process == 0 else None
        mine, self._rewards = self._rewards, {}
        dist.gather_object(mine, gathered, dst=0)
        if run.process == 0:
            for part in gathered:
                for uid, rewards in part.items():
                    self._rewards.setdefault(uid, []).extend(rewards)

    def _save(self, args: Any, state: Any, token: Optional[str]) -> None:
        run = self._run
        if run is None or run.process != 0:
            return
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if token is None or not (folder / "trainer_state.json").is_file():
            raise RuntimeError(
                f"on_save at step {state.global_step}: no trainer checkpoint at {folder} (or no trainer state "
                "saved by this process); TRLPromptFeed supports checkpoints in output_dir/checkpoint-<step>, "
                "without hyperparameter search"
            )
        if not run.window.ends_a_window(state.global_step - run.start_step):
            logger.warning(
                "checkpoint-%d is inside a generation window: its %d prompts count as untrained in it; a resume "
                "from it generates and trains them for a whole window again", state.global_step, run.window.prompts,
            )
        save_checkpoint_file(checkpoint_path(folder / FEED_FOLDER), self._trainer.state_dict())
        marker = {"format": MARKER_FORMAT, "format_version": MARKER_VERSION, "token": token,
                  "global_step": state.global_step, "holder": self.holder}  # fmt: skip
        partial = folder / FEED_FOLDER / (MARKER_FILE + ".partial")
        partial.write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        os.replace(partial, folder / FEED_FOLDER / MARKER_FILE)

    def _end(self) -> None:
        run, self._run = self._run, None
        self._rewards.clear()  # of prompts released: they are generated again
        if run is not None and run.process == 0:
            self._release(list(run.unacked))  # taken ahead or in an unfinished window


class PromptFeedCallback(TrainerCallback, ExportableState):
    """Acks trained prompts, saves the feed's state in TRL checkpoints, restores it on resume
    (see the module doc). Made by :class:`TRLPromptFeed`."""

    def __init__(self, source: Optional[TRLPromptFeed] = None) -> None:
        if source is None:
            raise ValueError(
                "PromptFeedCallback holds a live prompt feed and cannot be rebuilt from trainer_state.json: set "
                "restore_callback_states_from_checkpoint=False (the default); the callback restores the feed itself"
            )
        self._source = source
        self._token: Optional[str] = None

    def state(self) -> dict[str, Any]:
        """Called by transformers as it writes a checkpoint's trainer_state.json: a new token, which
        ``on_save`` writes beside the feed's state so a resume finds the matching pair."""
        self._token = uuid.uuid4().hex
        return {"args": {}, "attributes": {"data_state_token": self._token}}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._source._begin(args, state)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._source._ack_trained(state.global_step)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._source._save(args, state, self._token)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._source._end()


__all__ = ["FEED_FOLDER", "PromptFeedCallback", "TRLPromptFeed"]

