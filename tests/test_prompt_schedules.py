"""Outcomes, the per-prompt history, schedules and member weights in the PromptLedger (pure: no Ray, no I/O).

The producers are deterministic fakes over lists; a prompt's hidden difficulty (its chance of a
right sample) and a group's samples are hashes of its key and the step it was handed out at, so
every run is reproducible and a restored run can be compared with the uninterrupted one.
"""

from __future__ import annotations

import copy
from dataclasses import replace
import hashlib
import pickle
import random

import pytest
from test_prompt_ledger import ListProducer

from rl_data.prompt_feed.curation import MEMBER_WEIGHT
from rl_data.prompt_feed.ledger import PromptLedger, UidStateError
from rl_data.prompt_feed.merge import PASS_END, Item
from rl_data.prompt_feed.outcomes import MERGE_EVERY, Outcome, PromptHistory, PromptRecord, keys_digest
from rl_data.prompt_feed.schedules import (
    DEFERRED,
    DEPRIORITIZED,
    HAND_OUT,
    RETIRED,
    Decision,
    DifficultyFilter,
    Prioritized,
    ScheduleConfig,
    Uniform,
)


def unit(*parts: object) -> float:
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class MemberProducer(ListProducer):
    """A ListProducer whose prompts name their mixture member (``source_datasets``) when ``mixture``."""

    def __init__(self, member: str, size: int, mixture: bool = True) -> None:
        super().__init__(member, size, seed=0)
        self.mixture = mixture

    def next_item(self):
        got = super().next_item()
        if got is PASS_END or not self.mixture:
            return got
        return Item(got.key, {**got.payload, "source_datasets": self.name})


#: The keys of one pass over :func:`new_ledger`'s producers.
PASS_KEYS = {item.key for producer in (MemberProducer("a", 7), MemberProducer("b", 5)) for item in iter(producer.next_item, PASS_END)}


def shares_of(weights: dict[str, float]) -> dict[str, float]:
    """Member weights -> hand-out shares over a mixture of a and b at equal weights."""
    full = {"a": 1.0, "b": 1.0} | weights
    return {m: w / max(full.values()) for m, w in full.items()}


def new_ledger(schedule: ScheduleConfig, window: int = 8, state=None, mixture: bool = True) -> PromptLedger:
    producers = [MemberProducer("a", 7, mixture), MemberProducer("b", 5, mixture)]
    built = PromptLedger(producers, max_outstanding=window, schedule=schedule,
                         weight_shares=shares_of if schedule.reweight_every else None)  # fmt: skip
    if state is not None:
        built.load_state_dict(pickle.loads(pickle.dumps(state)))
    return built


def difficulty(key: str) -> float:
    """The hidden chance of a right sample: a third of the prompts always right, a third never."""
    u = unit("difficulty", key)
    return 1.0 if u < 1 / 3 else 0.0 if u < 2 / 3 else 0.5


def outcome(key: str, step: int) -> Outcome:
    correct = sum(unit("sample", key, step, i) < difficulty(key) for i in range(4))
    return Outcome(4, correct=correct)


class Trainer:
    """Takes 3 prompts a step; resolves each 0-3 steps later (by key: out of order), dropping zero-spread groups."""

    WEIGHTS = {4: ({"a": 0.5},), 11: ({"a": 1.0, "b": 0.25},)}

    def __init__(self, ledger: PromptLedger) -> None:
        self.ledger, self.held, self.handouts = ledger, {}, []

    def step(self, t: int) -> None:
        for shares in self.WEIGHTS.get(t, ()):
            self.ledger.set_member_weights(shares)
        for prompt in self.ledger.take(3):
            self.handouts.append((t, tuple(prompt.uid), prompt.key))
            self.held[prompt.uid] = (prompt.key, t)
        due = sorted((uid for uid, (key, at) in self.held.items() if t - at >= int(4 * unit("latency", key))),
                     key=lambda uid: (unit("order", uid), uid))  # fmt: skip
        for uid in due:
            key, at = self.held.pop(uid)
            result = outcome(key, at)
            if result.zero_spread:
                self.ledger.drop([uid], "zero_spread", outcomes=[result])
            else:
                self.ledger.ack([uid], outcomes=[result])


class PassRateWeights:
    """A user schedule: every prompt, and member weights 4p(1-p) of each member's pass rate (floor 0.1)."""

    def decide(self, record, draw, *, retired_share):
        return HAND_OUT

    def member_weights(self, members):
        rates = {name: m["pass_rate"] for name, m in members.items() if m["pass_rate"] is not None}
        return {name: max(0.1, 4 * p * (1 - p)) for name, p in rates.items()} or None


SCHEDULES = [
    ScheduleConfig(),
    ScheduleConfig(name="difficulty_filter", options={"retire_after": 1, "defer_after": 1, "defer_for": 2, "max_retired_share": 0.6}),
    ScheduleConfig(name="prioritized", options={"weight": "variance", "floor": 0.2}, seed=3),
    ScheduleConfig(name=f"{__name__}:PassRateWeights", reweight_every=5),
]
STEPS = 40


def test_an_outcome_checks_its_fields_and_tells_a_zero_spread():
    assert Outcome(4, correct=4).zero_spread and Outcome(4, correct=0).zero_spread and not Outcome(4, correct=1).zero_spread
    assert Outcome(4, correct=1).pass_rate == 0.25
    rewards = Outcome.from_rewards([1.0, 0.0, 1.0, 1.0], correct_at=1.0)
    assert (rewards.samples, rewards.correct, rewards.mean_reward, rewards.zero_spread) == (4, 3, 0.75, False)
    assert Outcome.from_rewards([0.3, 0.3]).zero_spread and Outcome.from_rewards([0.3, 0.3]).pass_rate == pytest.approx(0.3)
    with pytest.raises(ValueError, match=r"at least one reward and no NaN, found \[1.0, nan\]"):
        Outcome.from_rewards([1.0, float("nan")])
    for bad, match in [
        (dict(samples=0, correct=0), "samples must be an int >= 1"),
        (dict(samples=4), "needs correct"),
        (dict(samples=4, correct=5), r"correct must be an int in \[0, samples=4\]"),
        (dict(samples=4, mean_reward=1.5), r"mean_reward must be in \[0, 1\], found 1.5; rescale"),
        (dict(samples=4, mean_reward=0.5, reward_std=-1), "reward_std must be a number >= 0"),
    ]:
        with pytest.raises(ValueError, match=match):
            Outcome(**bad)


def test_a_record_tracks_tries_streaks_and_a_moving_pass_rate():
    record = PromptRecord()
    for correct in (4, 4):
        record = record.after(Outcome(4, correct=correct))
    assert (record.tries, record.streak, record.pass_rate, record.generated) == (2, 2, 1.0, 8)
    record = record.after(Outcome(4, correct=0))
    assert (record.streak, record.pass_rate) == (-1, 0.5)
    record = record.after(Outcome(4, correct=2))
    assert (record.tries, record.streak, record.pass_rate) == (4, 0, 0.5)


def test_the_history_holds_16_bytes_per_prompt_and_round_trips():
    history = PromptHistory()
    keys = [f"prompt-{i}" for i in range(3 * MERGE_EVERY + 17)]
    for i, key in enumerate(keys):
        history.observe(key, Outcome(4, correct=i % 5 if i % 5 < 5 else 4))
    history.put(keys[3], PromptRecord(retired=True))
    for key in keys[10:13]:  # deferred, once again (counted once), one of them (pending) back
        history.put(key, PromptRecord(skip_left=4))
        history.put(key, PromptRecord(skip_left=3))
    history.put(keys[-1], PromptRecord(skip_left=2))
    history.put(keys[-1], PromptRecord(skip_left=0))
    state = history.state()
    assert len(state["keys"]) == len(state["records"]) == 8 * len(keys)
    assert history.nbytes == 16 * len(keys) and len(history) == len(keys) and history.retired == 1
    assert history.deferred == 3
    restored = PromptHistory.from_state(copy.deepcopy(state))
    assert [restored.get(k) for k in keys[:50]] == [history.get(k) for k in keys[:50]]
    assert restored.get(keys[-1]) == history.get(keys[-1]) and restored.get("never seen") is None
    assert (restored.retired, restored.deferred) == (1, 3) and restored.state() == state
    with pytest.raises(ValueError, match="8 bytes each per prompt; the checkpoint is damaged"):
        PromptHistory.from_state({"keys": state["keys"][:-8], "records": state["records"]})
    with pytest.raises(ValueError, match="unsorted or repeated key hashes"):
        PromptHistory.from_state({"keys": state["keys"][8:16] + state["keys"][:8], "records": state["records"][:16]})


def test_difficulty_filter_retires_the_solved_defers_the_failed_and_bounds_both():
    schedule = DifficultyFilter(retire_after=2, defer_after=2, defer_for=2, max_retired_share=0.5)
    solved = PromptRecord().after(Outcome(4, correct=4)).after(Outcome(4, correct=4))
    failed = PromptRecord().after(Outcome(4, correct=0)).after(Outcome(4, correct=0))
    assert schedule.decide(None, 0.5, retired_share=0.0) == HAND_OUT
    assert schedule.decide(PromptRecord().after(Outcome(4, correct=4)), 0.5, retired_share=0.0) == HAND_OUT  # once is not twice
    retired = schedule.decide(solved, 0.5, retired_share=0.1)
    assert retired.skip == RETIRED and retired.record.retired
    assert schedule.decide(retired.record, 0.5, retired_share=0.6) == Decision(RETIRED)  # stays retired
    assert schedule.decide(solved, 0.5, retired_share=0.5) == HAND_OUT  # the share is full
    deferred = schedule.decide(failed, 0.5, retired_share=0.0)
    assert (deferred.skip, deferred.record.skip_left, deferred.record.deferred) == (DEFERRED, 1, True)
    again = schedule.decide(deferred.record, 0.5, retired_share=0.0)
    assert (again.skip, again.record.skip_left) == (DEFERRED, 0)
    assert schedule.decide(again.record, 0.5, retired_share=0.0) == HAND_OUT  # another try after defer_for
    failing = again.record
    for expected_skip in (2, 4, 4, 6, 6, 8, 8, 8):  # each failed run of 2 tries defers 2 longer, up to max_defer 8
        failing = failing.after(Outcome(4, correct=0))
        decision = schedule.decide(failing, 0.5, retired_share=0.0)
        if decision.skip is None:  # one failed try since the last deferral: not yet a run of 2
            failing = failing.after(Outcome(4, correct=0))
            decision = schedule.decide(failing, 0.5, retired_share=0.0)
        assert (decision.skip, decision.record.skip_left + 1) == (DEFERRED, expected_skip)
        failing = replace(decision.record, skip_left=0)
    assert schedule.decide(failing.after(Outcome(4, correct=1)), 0.5, retired_share=0.0) == HAND_OUT  # a success ends the run
    assert Uniform().decide(solved, 0.5, retired_share=0.0) == HAND_OUT


def test_prioritized_hands_out_by_pass_rate_with_a_floor():
    schedule = Prioritized(weight="variance", floor=0.1)
    draws = [i / 1000 for i in range(1000)]

    def share(record):
        return sum(schedule.decide(record, d, retired_share=0.0) == HAND_OUT for d in draws) / len(draws)

    half = PromptRecord().after(Outcome(4, correct=2))
    easy = PromptRecord().after(Outcome(4, correct=4))
    quarter = PromptRecord().after(Outcome(4, correct=1))
    assert (share(None), share(half), share(easy)) == (1.0, 1.0, 0.1)
    assert share(quarter) == pytest.approx(0.75, abs=0.002)
    assert schedule.decide(easy, 0.5, retired_share=0.0) == Decision(DEPRIORITIZED)
    failure = Prioritized(weight="failure", floor=0.2)
    assert sum(failure.decide(quarter, d, retired_share=0.0) == HAND_OUT for d in draws) == 750


class EveryOther:
    """A user schedule: skips every prompt whose draw is below ``below``."""

    def __init__(self, below: float = 0.5) -> None:
        self.below = below

    def decide(self, record, draw, *, retired_share):
        return Decision("user_skip") if draw < self.below else HAND_OUT


def test_schedules_are_named_built_in_or_by_import_path_and_refuse_bad_options():
    assert isinstance(ScheduleConfig(name="prioritized").build(), Prioritized)
    user = ScheduleConfig(name=f"{__name__}:EveryOther", options={"below": 0.25}).build()
    assert isinstance(user, EveryOther) and user.below == 0.25
    with pytest.raises(ValueError, match=r"schedule 'fancy' is not built in \(uniform, difficulty_filter, prioritized\)"):
        ScheduleConfig(name="fancy").build()
    with pytest.raises(ValueError, match=r"cannot import schedule 'no_such_module:X'"):
        ScheduleConfig(name="no_such_module:X").build()
    with pytest.raises(ValueError, match=r"schedule 'difficulty_filter' refuses options \{'retire_after': 0\}"):
        ScheduleConfig(name="difficulty_filter", options={"retire_after": 0}).build()
    with pytest.raises(ValueError, match=r"schedule 'prioritized' refuses options \{'wieght': 'failure'\}"):
        ScheduleConfig(name="prioritized", options={"wieght": "failure"}).build()


def run(schedule: ScheduleConfig, steps: int = STEPS) -> tuple[Trainer, list]:
    """The uninterrupted run, with the ledger's state and the trainer's held prompts before every step."""
    trainer = Trainer(new_ledger(schedule))
    saved = []
    for t in range(steps):
        saved.append((trainer.ledger.state_dict(), dict(trainer.held)))
        trainer.step(t)
    return trainer, saved


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.name)
def test_every_epoch_is_handed_out_or_skipped_exactly_once_and_counted(schedule):
    trainer, _ = run(schedule, steps=60)
    for uid in sorted(trainer.held):  # drain
        trainer.ledger.ack([uid])
    summary = trainer.ledger.summary()
    done = [e for e in summary["epochs"] if e["size"] is not None]
    assert len(done) >= 3
    for epoch in done:
        assert epoch["resolved_exactly_once"] is True
        handed = [uid for _, uid, _ in trainer.handouts if uid[0] == epoch["epoch"]]
        assert len(handed) == len(set(handed)) == epoch["taken"]
        assert epoch["taken"] + sum(epoch["skipped"].values()) == epoch["size"] == 12
        skipped_keys = PASS_KEYS - {key for _, uid, key in trainer.handouts if uid[0] == epoch["epoch"]}
        assert len(skipped_keys) == sum(epoch["skipped"].values())
        assert epoch.get("skipped_digest", 0) == keys_digest(skipped_keys)
    earlier = summary["earlier_epochs"] or {"skipped": {}}  # epochs folded beyond the newest 32 ended ones
    assert len(summary["epochs"]) <= 32 + 2
    assert sum(summary["skipped"].values()) == sum(sum(e["skipped"].values()) for e in [*summary["epochs"], earlier])
    assert summary["skipped"].get(MEMBER_WEIGHT, 0) > 0  # the weights set in flight thinned member a, then b
    members = summary["members"]
    assert members["a"]["taken"] + members["b"]["taken"] == len(trainer.handouts)
    assert sum(sum(m["skipped"].values()) for m in members.values()) == sum(summary["skipped"].values())
    if schedule.name == "uniform":
        assert set(summary["skipped"]) == {MEMBER_WEIGHT}
    elif schedule.name == "difficulty_filter":
        assert summary["skipped"][RETIRED] > 0 and summary["skipped"][DEFERRED] > 0
        assert summary["history"]["retired"] <= 0.6 * summary["history"]["prompts"] + 1
    elif schedule.name == "prioritized":
        assert summary["skipped"][DEPRIORITIZED] > 0
    else:  # weights from the members' pass rates, every 5 positions; the settled ones pruned
        assert set(summary["skipped"]) == {MEMBER_WEIGHT} and len(summary["member_weights"]) <= 2
        (epoch, position, shares), *_ = summary["member_weights"]
        assert position % 5 == 0 and max(shares.values()) == 1.0 and min(shares.values()) < 1.0
    assert summary["history"]["bytes"] <= 16 * summary["history"]["prompts"]


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.name)
def test_a_restore_at_every_step_hands_out_the_rest_exactly_as_the_uninterrupted_run(schedule):
    """Restore the ledger (and the trainer's held prompts) before every step: the prompts held then
    come back first, then the same acks and outcomes give the same hand-outs, skips and history."""
    reference, saved = run(schedule)
    final = reference.ledger.state_dict()
    for s, (state, held) in enumerate(saved):
        trainer = Trainer(new_ledger(schedule, state=state))
        back = trainer.ledger.take(len(held)) if held else []
        assert sorted(tuple(p.uid) for p in back) == sorted(tuple(uid) for uid in held), f"restore before step {s}"
        trainer.held = {p.uid: held[p.uid] for p in back}
        for t in range(s, STEPS):
            trainer.step(t)
        assert trainer.handouts == [h for h in reference.handouts if h[0] >= s], f"restore before step {s}"
        mine = trainer.ledger.state_dict()
        assert mine["history"] == final["history"] and mine["members"] == final["members"], f"restore before step {s}"
        assert [(e["epoch"], e["acked"], e["dropped"], e.get("skipped")) for e in mine["epochs"]] == \
               [(e["epoch"], e["acked"], e["dropped"], e.get("skipped")) for e in final["epochs"]]  # fmt: skip


def test_a_uniform_ledger_without_outcomes_keeps_its_checkpoint_and_loads_any_schedule_only_into_the_same():
    plain = new_ledger(ScheduleConfig(), mixture=False)
    plain.ack([p.uid for p in plain.take(3)])
    assert set(plain.state_dict()) == {"format", "format_version", *PromptLedger.STATE_KEYS}
    filtered = ScheduleConfig(name="difficulty_filter")
    with pytest.raises(ValueError, match=r"another schedule: in checkpoint: \{'name': 'uniform'.*/ in this feed: \{'name': 'difficulty_filter'"):
        new_ledger(filtered, state=plain.state_dict(), mixture=False)
    mixture = new_ledger(ScheduleConfig())
    mixture.ack([p.uid for p in mixture.take(3)])
    assert mixture.state_dict()["members"]["a"]["taken"] + mixture.state_dict()["members"]["b"]["taken"] == 3
    adaptive = new_ledger(filtered)
    adaptive.ack([p.uid for p in adaptive.take(2)], outcomes=[Outcome(4, correct=4), None])
    state = adaptive.state_dict()
    assert set(PromptLedger.ADAPTIVE_KEYS) <= set(state)
    with pytest.raises(ValueError, match=r"in checkpoint: \{'name': 'difficulty_filter'.*/ in this feed: \{'name': 'prioritized'"):
        new_ledger(ScheduleConfig(name="prioritized"), state=state)
    with pytest.raises(ValueError, match=r"options.*retire_after.*3"):
        new_ledger(ScheduleConfig(name="difficulty_filter", options={"retire_after": 3}), state=state)
    assert new_ledger(filtered, state=state).summary()["history"]["prompts"] == 1


def test_outcomes_and_weights_are_checked_before_anything_changes():
    ledger = new_ledger(ScheduleConfig())
    taken = ledger.take(2)
    with pytest.raises(ValueError, match="ack got 2 uids and 1 outcomes; give one outcome"):
        ledger.ack([p.uid for p in taken], outcomes=[Outcome(4, correct=1)])
    with pytest.raises(ValueError, match=r"ack got \{'correct': 1\} as an outcome, expected rl_data.Outcome or None"):
        ledger.ack([p.uid for p in taken], outcomes=[None, {"correct": 1}])
    assert ledger.outstanding == 2
    reached = ledger.set_member_weights({"a": 0.5})
    assert tuple(reached) == (0, 2)
    with pytest.raises(ValueError, match=r"cannot take effect at uid \(0, 1\): the stream already reached \(0, 2\)"):
        ledger.set_member_weights({"a": 1.0}, at=(0, 1))
    with pytest.raises(ValueError, match=r"numbers in \[0, 1\], found \{'b': 2\}"):
        ledger.set_member_weights({"a": 1.0, "b": 2})
    ledger.drop([p.uid for p in taken], "zero_spread", outcomes=[Outcome(4, correct=0), Outcome(4, correct=4)])
    with pytest.raises(UidStateError, match="already resolved"):
        ledger.ack([taken[0].uid])
    assert ledger.summary()["history"]["prompts"] == 2


def test_a_schedule_that_skips_everything_is_refused_not_spun_on(monkeypatch):
    import rl_data.prompt_feed.ledger as ledger_module

    monkeypatch.setattr(ledger_module, "MAX_SKIPPED_IN_A_ROW", 50)
    ledger = new_ledger(ScheduleConfig(name=f"{__name__}:EveryOther", options={"below": 1.0}))
    with pytest.raises(ValueError, match=r"skipped 51 prompts in a row.*expected some to be handed out"):
        ledger.take(1)


def test_random_weights_and_outcomes_never_hand_a_prompt_out_twice_in_an_epoch():
    rng = random.Random(7)
    ledger = new_ledger(SCHEDULES[1], window=5)
    handed, held = set(), []
    for _ in range(400):
        if rng.random() < 0.1:
            ledger.set_member_weights({"a": rng.choice([0.0, 0.3, 1.0]), "b": rng.choice([0.2, 1.0])})
        for prompt in ledger.take(rng.randint(0, 3)):
            assert prompt.uid not in handed
            handed.add(prompt.uid)
            held.append(prompt)
        rng.shuffle(held)
        while held and rng.random() < 0.6:
            prompt = held.pop()
            ledger.ack([prompt.uid], outcomes=[outcome(prompt.key, len(handed))])
    assert ledger.summary()["epoch"] >= 5


class FailsOnce:
    """A user schedule whose first decision raises (a bug, a timeout): the prompt must not be lost."""

    calls = 0

    def decide(self, record, draw, *, retired_share):
        FailsOnce.calls += 1
        if FailsOnce.calls == 3:
            raise RuntimeError("the schedule's service timed out")
        return HAND_OUT


def test_a_decision_that_raises_loses_no_prompt_and_the_next_take_decides_it_again():
    FailsOnce.calls = 0
    ledger = new_ledger(ScheduleConfig(name=f"{__name__}:FailsOnce"), window=30)
    first = ledger.take(2)
    with pytest.raises(RuntimeError, match="timed out"):
        ledger.take(5)  # the third prompt's decision raises: nothing of this take is handed out
    assert ledger.outstanding == 2
    rest = ledger.take(10)
    assert [tuple(p.uid) for p in first + rest] == [(0, p) for p in range(12)]
    ledger.ack([p.uid for p in first + rest])
    assert ledger.summary()["epochs"][0]["size"] is None and ledger.take(1)[0].uid == (1, 0)
    assert ledger.summary()["epochs"][0]["resolved_exactly_once"] is True


def test_reweighting_needs_a_member_weights_method_and_a_mixture():
    with pytest.raises(ValueError, match=r"has reweight_every 5 but no member_weights\(members\) method"):
        ScheduleConfig(name="prioritized", reweight_every=5).build()
    with pytest.raises(ValueError, match="reweight_every 5, which needs a feed over a mixture of datasets"):
        PromptLedger([MemberProducer("a", 3)], max_outstanding=4, schedule=ScheduleConfig(name=f"{__name__}:PassRateWeights", reweight_every=5))
