"""Schedules, outcomes and live member weights through the prompt feed on real local Ray.

The feed over the synthetic task (the subject is the feed: its ledger, ranks and checkpoints) runs
``difficulty_filter`` with outcomes from a stand-in policy whose chance of a right sample is a
hidden function of the prompt; a mixture of two real ``rl_prompt`` Energon datasets (real
tokenizer) gets new member weights in flight. Each run is compared with itself after a live rewind
to an earlier checkpoint (and a killed rank actor): the same acks and outcomes give the same
hand-outs, skips and history.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any

import pytest
from distributed_fixtures import ENERGON_WORKERS_0_SLOW, TIMEOUT_S, runtime_config, shut_down
from restore_check import assert_rewinds_at_every_step
from test_prompt_feed import _scrape, _spec, mixture_members, prompt_root  # noqa: F401 - the fixtures

from rl_data.config_blocks import ConfigError
from rl_data.distributed.client import wait_until_name_is_free
from rl_data.distributed.config import LoaderSpec
from rl_data.energon.dataset_writer import write_energon_dataset
from rl_data.energon.sample_format import encode_sample
from rl_data.preprocess.adapters import resolve_adapter
from rl_data.prompt_data import arithmetic_word_problems
from rl_data.prompt_feed.client import attach_feed
from rl_data.prompt_feed.feed import FeedConfig, start_prompt_feed
from rl_data.prompt_feed.outcomes import Outcome
from rl_data.prompt_feed.schedules import ScheduleConfig
from rl_data.tasks.synthetic import synthetic_loader_spec

NAMESPACE = "rl_data_feed_schedule_tests"
#: 2 ranks x 12 samples, batches of 4: 24 prompts an epoch.
SPEC = synthetic_loader_spec(batch_size=4, samples_per_rank=12, tokens_per_sample=8, name="schedule-synthetic")
FILTER = ScheduleConfig(name="difficulty_filter", options={"retire_after": 1, "defer_after": 1, "defer_for": 1, "max_retired_share": 0.5})


def unit(*parts: object) -> float:
    return int.from_bytes(hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest(), "big") / 2**64


def outcome(key: str, step: int) -> Outcome:
    """4 samples; a third of the prompts always right, a third never, the rest half the time."""
    u = unit("difficulty", key)
    p = 1.0 if u < 1 / 3 else 0.0 if u < 2 / 3 else 0.5
    return Outcome(4, correct=sum(unit("sample", key, step, i) < p for i in range(4)))


def config(world: int = 2) -> Any:
    return runtime_config(world, 2, namespace=NAMESPACE, name=f"sched-{uuid.uuid4().hex[:8]}")


def mixture_spec(members: dict[str, str]) -> LoaderSpec:
    """A virtual-mode mixture of ``members`` (name -> dataset path) at equal weights."""
    energon = {"task": "rl_prompt", "shuffle_buffer_size": 6, "max_samples_per_sequence": 2}
    mixture = [{"name": name, "path": path, "weight": 0.5} for name, path in members.items()]
    return LoaderSpec(
        data_config={"energon": energon, "shuffle": True, "task": {"generation_padding": "left"}},
        source={"mixture": mixture, "split": "train", "epoch_mode": "virtual", "virtual_epoch_length": 5},
        batch_size=4, max_sequence_length=256,
    )  # fmt: skip


class Trainer:
    """Takes 4 prompts a step and resolves each 0-2 steps later, out of order, with its outcome."""

    def __init__(self, rollout: Any, trainer: Any) -> None:
        self.rollout, self.trainer, self.held, self.log = rollout, trainer, {}, []

    def step(self, t: int) -> None:
        for prompt in self.rollout.take(4):
            self.log.append((t, tuple(prompt.uid), prompt.key))
            self.held[tuple(prompt.uid)] = (prompt.key, t)
        due = sorted((uid for uid, (key, at) in self.held.items() if t - at >= int(3 * unit("latency", key))),
                     key=lambda uid: unit("order", uid))  # fmt: skip
        if due:
            results = [outcome(*self.held.pop(uid)) for uid in due]
            self.trainer.ack(due, outcomes=results)


@pytest.mark.timeout(300)
def test_a_difficulty_filtered_feed_rewound_with_a_rank_killed_repeats_its_hand_outs_and_counts_every_skip(ray_session, metrics_port):
    cfg = config()
    handle = start_prompt_feed(cfg, SPEC, FeedConfig(max_outstanding=16, schedule=FILTER))
    try:
        rollout, trainer = attach_feed(cfg.name, cfg.namespace, timeout_s=TIMEOUT_S)
        first = Trainer(rollout, trainer)
        saved = {}
        for t in range(30):
            if t in (9, 20):
                saved[t] = (trainer.state_dict(), dict(first.held))
            first.step(t)
        reference, final, final_state = first.log, rollout.status(), trainer.state_dict()
        assert final["skipped"]["retired"] > 0 and final["skipped"]["deferred"] > 0
        done = [e for e in final["epochs"] if e["size"] is not None]
        assert len(done) >= 2 and all(e["taken"] + sum(e["skipped"].values()) == e["size"] == 24 for e in done)
        assert final["history"]["prompts"] == 24 and final["history"]["bytes"] <= 16 * 24
        assert final["schedule"]["name"] == "difficulty_filter"

        for start in (9, 20):
            state, held = saved[start]
            trainer.load_state_dict(state)  # a live rewind
            again = Trainer(rollout, trainer)
            back = rollout.take(len(held)) if held else []
            assert sorted(tuple(p.uid) for p in back) == sorted(held)
            again.held = dict(held)
            for t in range(start, 30):
                if t == start + 3:
                    name = rollout.status()["rank_actor_names"][1]
                    ray_session.kill(ray_session.get_actor(name, namespace=cfg.namespace), no_restart=True)
                    wait_until_name_is_free(name, cfg.namespace, TIMEOUT_S)
                again.step(t)
            assert again.log == [h for h in reference if h[0] >= start], f"rewound to step {start}"
            status = rollout.status()
            assert [(e["acked"], e["skipped"]) for e in status["epochs"]] == [(e["acked"], e["skipped"]) for e in final["epochs"]]
            assert trainer.state_dict()["ledger"]["history"] == final_state["ledger"]["history"]
        assert rollout.status()["restarts"] == [0, 2]
        labels = {"feed": cfg.name, "reason": "retired", "member": ""}
        assert wait_for_at_least(metrics_port, "ray_rl_data_feed_skipped_total", labels, final["skipped"]["retired"])
        assert wait_for_at_least(metrics_port, "ray_rl_data_feed_outcomes_total", {"feed": cfg.name}, len(reference))
        history = rollout.status()["history"]
        assert history["retired"] > 0 and history["deferred"] >= 0
        for series, value in (
            ("ray_rl_data_feed_retired_prompts", history["retired"]),
            ("ray_rl_data_feed_checkpoint_seconds_count", 3),  # trainer.state_dict() at steps 9, 20 and the end
            ("ray_rl_data_feed_checkpoint_bytes", 16 * 24),  # the history of 24 prompts, and more
        ):
            assert wait_for_at_least(metrics_port, series, {"feed": cfg.name}, value), series
        deadline = time.monotonic() + 60  # a gauge reaches the endpoint within Ray's report interval
        while _scrape(metrics_port, "ray_rl_data_feed_deferred_prompts", feed=cfg.name) != history["deferred"]:
            assert time.monotonic() < deadline, f"the deferred gauge never showed {history['deferred']}"
            time.sleep(0.5)
    finally:
        shut_down(ray_session, handle, cfg.name, cfg.namespace)


def wait_for_at_least(port: int, series: str, labels: dict[str, str], value: float) -> bool:
    """Whether the series reaches ``value`` within 60 s (Ray reports metrics every few seconds)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        seen = _scrape(port, series, **labels)
        if seen is not None and seen >= value:
            return True
        time.sleep(0.5)
    return False


@pytest.mark.timeout(300)
def test_new_member_weights_in_flight_take_effect_at_their_uid_and_a_rewind_repeats_them(ray_session, mixture_members, tmp_path):
    """A virtual-mode mixture easy 0.5 / hard 0.5 (one rank actor: torch, Energon, the real tokenizer):
    from the uid the new weights name on, the feed hands out only 'hard' prompts (easy at weight 0)
    and counts the skipped 'easy' ones; a rewind to a checkpoint taken before the change, with the
    same call, repeats every hand-out."""
    spec = mixture_spec(mixture_members)
    cfg = config(world=1)
    handle = start_prompt_feed(cfg, spec, FeedConfig(max_outstanding=40))
    try:
        rollout, trainer = attach_feed(cfg.name, cfg.namespace, timeout_s=TIMEOUT_S)

        def run() -> list[tuple[tuple[int, int], str, str]]:
            handed = []
            for n in (6, 0, 10):
                if n == 0:
                    assert trainer.set_member_weights({"easy": 0.0}) == [0, 6]
                    continue
                prompts = rollout.take(n)
                trainer.ack([p.uid for p in prompts])
                handed += [(tuple(p.uid), p.key, p.payload["source_datasets"]) for p in prompts]
            return handed

        fresh = trainer.state_dict()
        saved = trainer.save_checkpoint(str(tmp_path / "fresh"))  # a mixture's state, no outcome yet: loads with weights_only
        assert trainer.load_checkpoint(str(tmp_path / "fresh"))["history"]["prompts"] == 0 and saved.endswith(".pt")
        first = run()
        assert {member for _, _, member in first[:6]} == {"easy", "hard"}
        assert {member for _, _, member in first[6:]} == {"hard"} and len(first) == 16
        assert [uid for uid, _, _ in first[6:]] == sorted(uid for uid, _, _ in first[6:])
        status = rollout.status()
        skipped = status["members"]["easy"]["skipped"]["member_weight"]
        assert status["skipped"] == {"member_weight": skipped} and skipped > 0
        assert first[-1][0] == (0, 16 + skipped - 1)  # every uid up to the last hand-out: handed out or skipped
        assert status["member_weights"] == [[0, 6, {"easy": 0.0, "hard": 1.0}]]
        assert status["members"]["hard"]["taken"] + status["members"]["easy"]["taken"] == 16

        trainer.load_state_dict(fresh)
        assert run() == first
        with pytest.raises(ValueError, match=r"member weights name \['medium'\], not members of the mixture; its members are \['easy', 'hard'\]"):
            trainer.set_member_weights({"medium": 1.0})
        with pytest.raises(ValueError, match="every weight is 0"):
            trainer.set_member_weights({"easy": 0, "hard": 0})
    finally:
        shut_down(ray_session, handle, cfg.name, cfg.namespace)

    # the same change as a schedule over the stream, in the feed's config: the same hand-outs
    planned = ScheduleConfig(member_weights=[{"at": [0, 6], "weights": {"easy": 0.0}}])
    cfg = config(world=1)
    handle = start_prompt_feed(cfg, spec, FeedConfig(max_outstanding=40, schedule=planned))
    try:
        rollout, trainer = attach_feed(cfg.name, cfg.namespace, timeout_s=TIMEOUT_S)
        prompts = rollout.take(6) + rollout.take(10)
        assert [(tuple(p.uid), p.key, p.payload["source_datasets"]) for p in prompts] == first
        state = trainer.state_dict()
        assert state["ledger"]["schedule"]["member_weights"] == [[0, 6, {"easy": 0.0}]]
    finally:
        shut_down(ray_session, handle, cfg.name, cfg.namespace)
    with pytest.raises(ConfigError, match=r"feed_config.schedule: member weights name \['medium'\], not members"):
        start_prompt_feed(config(world=1), spec, FeedConfig(max_outstanding=4, schedule=ScheduleConfig(
            member_weights=[{"at": [0, 0], "weights": {"medium": 1.0}}])))  # fmt: skip


def test_a_bad_schedule_is_refused_before_any_actor_starts(ray_session):
    with pytest.raises(ConfigError, match=r"feed_config.schedule: schedule 'difficulty_filter' refuses options \{'defer_for': 0\}"):
        start_prompt_feed(config(), SPEC, FeedConfig(max_outstanding=4, schedule={"name": "difficulty_filter", "options": {"defer_for": 0}}))


@pytest.mark.timeout(300)
def test_set_member_weights_is_refused_by_a_feed_over_one_dataset(ray_session):
    cfg = config(world=1)
    handle = start_prompt_feed(cfg, SPEC, FeedConfig(max_outstanding=4))
    try:
        _, trainer = attach_feed(cfg.name, cfg.namespace, timeout_s=TIMEOUT_S)
        with pytest.raises(ValueError, match="set_member_weights needs a feed over a mixture of datasets; this feed reads"):
            trainer.set_member_weights({"a": 1.0})
    finally:
        shut_down(ray_session, handle, cfg.name, cfg.namespace)


@pytest.mark.timeout(300)
def test_the_dynamic_sampler_fills_every_batch_with_groups_that_have_a_reward_spread(ray_session):
    from rl_data.prompt_feed.dynamic_sampling import DynamicSampler

    cfg = config()
    handle = start_prompt_feed(cfg, SPEC, FeedConfig(max_outstanding=12))
    try:
        rollout, trainer = attach_feed(cfg.name, cfg.namespace, timeout_s=TIMEOUT_S)
        sampler = DynamicSampler(rollout, trainer, lambda prompts: [(p.key, outcome(p.key, p.uid[0])) for p in prompts], oversample=1.5)
        trained = []
        for _ in range(8):
            batch = sampler.next_batch(3)
            assert len(batch.prompts) == 3 and not any(o.zero_spread for o in batch.outcomes)
            assert batch.groups == [p.key for p in batch.prompts]
            sampler.ack(batch)
            trained += batch.uids
        totals, status = sampler.totals, rollout.status()
        assert len(trained) == len(set(trained)) == 24 == status["totals"]["acked"]
        assert status["dropped"] == {"zero_spread": totals.dropped} and totals.dropped > 0
        assert totals.taken == totals.kept + totals.dropped == status["totals"]["taken"]
        assert (totals.samples, totals.wasted_samples) == (4 * totals.taken, 4 * totals.dropped)
        assert sum(totals.per_batch_extra_groups) == totals.dropped
        assert totals.samples_per_useful_group == pytest.approx(totals.samples / totals.kept)
        assert status["outstanding"] == totals.kept - 24  # useful groups generated ahead wait for the next batch

        full = DynamicSampler(rollout, trainer, lambda prompts: [(None, Outcome(4, correct=2)) for _ in prompts])
        rollout.take(12 - status["outstanding"])  # fill the window
        with pytest.raises(RuntimeError, match="the feed handed out no prompt with 0 of 2 groups ready: its window is full"):
            full.next_batch(2)
    finally:
        shut_down(ray_session, handle, cfg.name, cfg.namespace)


@pytest.mark.timeout(300)
def test_prompts_a_dead_worker_held_come_back_whatever_the_schedule_learned_since(ray_session):
    """Released prompts were decided when first reached: they are handed out again first, even
    when their outcomes since (of the same keys in the history) would have the schedule skip them."""
    from rl_data.prompt_feed.client import RolloutClient

    cfg = config()
    handle = start_prompt_feed(cfg, SPEC, FeedConfig(max_outstanding=30, schedule=FILTER))
    try:
        worker = RolloutClient(handle, timeout_s=TIMEOUT_S, holder="worker-1")
        other, trainer = attach_feed(cfg.name, cfg.namespace, timeout_s=TIMEOUT_S)
        held = worker.take(6)
        delivered = held[0]
        trainer.ack([p.uid for p in other.take(18)], outcomes=None)  # the rest of epoch 0, no outcomes
        released = trainer.release_holder("worker-1", keep=[delivered.uid])
        assert released == [p.uid for p in held[1:]]
        trainer.ack([delivered.uid], outcomes=[Outcome(4, correct=4)])  # solved: retired from epoch 1 on
        again = other.take(5)
        assert [(p.uid, p.key) for p in again] == [(p.uid, p.key) for p in held[1:]]
        trainer.drop([p.uid for p in again], "zero_spread", outcomes=[Outcome(4, correct=0)] * 5)  # failed: deferred
        following = other.take(19)  # epoch 1 hands out the 18 others, then epoch 2 begins
        assert [p.uid[0] for p in following] == [1] * 18 + [2]
        epoch_1 = {p.key for p in following[:18]}
        status = other.status()
        assert status["epochs"][0]["resolved_exactly_once"] is True
        assert (status["epochs"][1]["size"], status["epochs"][1]["skipped"]) == (24, {"retired": 1, "deferred": 5})
        assert delivered.key not in epoch_1 and not {p.key for p in again} & epoch_1
    finally:
        shut_down(ray_session, handle, cfg.name, cfg.namespace)


@pytest.mark.timeout(300)
def test_a_schedule_sets_member_weights_from_the_members_pass_rates_and_a_rewind_repeats_them(
    ray_session, mixture_members, metrics_port
):
    """``PassRateWeights`` (tests/test_prompt_schedules.py) every 4 positions: 'easy' always solved
    (weight 0.1 from then on), 'hard' solved half the time (weight 1)."""
    spec = mixture_spec(mixture_members)
    schedule = ScheduleConfig(name="test_prompt_schedules:PassRateWeights", reweight_every=4)
    cfg = config(world=1)
    handle = start_prompt_feed(cfg, spec, FeedConfig(max_outstanding=40, schedule=schedule))
    try:
        rollout, trainer = attach_feed(cfg.name, cfg.namespace, timeout_s=TIMEOUT_S)

        def run() -> list[tuple[tuple[int, int], str]]:
            handed = []
            for _ in range(8):
                prompts = rollout.take(3)
                members = [p.payload["source_datasets"] for p in prompts]
                trainer.ack([p.uid for p in prompts], outcomes=[Outcome(4, correct=4 if m == "easy" else 2) for m in members])
                handed += [(tuple(p.uid), m) for p, m in zip(prompts, members)]
            return handed

        fresh = trainer.state_dict()
        first = run()
        status = rollout.status()
        easy_later = [m for uid, m in first[12:]].count("easy")
        assert status["skipped"].get("member_weight", 0) > 0 and easy_later <= 3
        assert status["members"]["easy"]["pass_rate"] == 1.0 and status["members"]["hard"]["pass_rate"] == 0.5
        assert all(position % 4 == 0 for _, position, _ in status["member_weights"])
        trainer.load_state_dict(fresh)
        assert run() == first
        for series, labels, value in (
            ("ray_rl_data_feed_member_pass_rate", {"member": "easy"}, 1.0),
            ("ray_rl_data_feed_outcomes_total", {"member": "hard"}, status["members"]["hard"]["outcomes"]),
            ("ray_rl_data_feed_skipped_total", {"member": "easy", "reason": "member_weight"}, 1),
            ("ray_rl_data_feed_member_taken_total", {"member": "hard"}, 2 * status["members"]["hard"]["taken"]),  # 2 runs
        ):
            assert wait_for_at_least(metrics_port, series, {"feed": cfg.name, **labels}, value), series
    finally:
        shut_down(ray_session, handle, cfg.name, cfg.namespace)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("workers", ENERGON_WORKERS_0_SLOW)
def test_a_difficulty_filter_over_energon_ranks_rewound_after_every_step_repeats_its_hand_outs(ray_session, prompt_root, workers):
    """The step oracle with a schedule, over real ``rl_prompt`` Energon ranks with 0 and 2 workers: a
    step takes 5 prompts and acks them with their outcomes; the live feed is rewound to the checkpoint
    after every step (across epoch ends, with prompts skipped) and must hand out the same rest."""
    cfg = config()
    handle = start_prompt_feed(cfg, _spec(prompt_root, workers), FeedConfig(max_outstanding=20, schedule=FILTER))
    try:
        rollout, trainer = attach_feed(cfg.name, cfg.namespace, timeout_s=TIMEOUT_S)

        def take() -> list[tuple[tuple[int, int], str]]:
            prompts = rollout.take(5)
            trainer.ack([p.uid for p in prompts], outcomes=[outcome(p.key, p.uid[0]) for p in prompts])
            return [(tuple(p.uid), p.key) for p in prompts]

        found = assert_rewinds_at_every_step(take, trainer.state_dict, trainer.load_state_dict, 14,
                                             before_rewind=lambda: rollout.take(3))  # fmt: skip
        handed = [uid for step in found for uid, _ in step]
        assert len(handed) == len(set(handed)) == 70 and max(e for e, _ in handed) >= 2  # 3 epochs at least
        status = rollout.status()
        assert status["skipped"]["retired"] > 0 and status["skipped"]["deferred"] > 0
        for epoch in status["epochs"][:2]:  # ended: every prompt handed out or skipped, once
            assert epoch["resolved_exactly_once"] and epoch["taken"] + sum(epoch["skipped"].values()) == epoch["size"]
    finally:
        shut_down(ray_session, handle, cfg.name, cfg.namespace)
