"""PromptLedger: exactly once per prompt with out-of-order completion (pure, no Ray, no I/O).

Each named test is a regression for a failure public RL frameworks had (issue 14). The
producers are deterministic fakes over lists: an integer-cursor state, a seeded shuffle per
pass. The expected stream is computed independently: epoch e is the zip-longest interleave of
the producers' pass-e orders (item 0 of each producer, then item 1 of each that has one, ...).
"""

from __future__ import annotations

import functools
import json
import random
from collections import Counter

import pytest

from rl_data.prompt_feed.ledger import PromptLedger, UidStateError
from rl_data.prompt_feed.merge import PASS_END, Item, Uid


class ListProducer:
    """``size`` prompts named ``{name}-{i}``, a new seeded order every pass."""

    def __init__(self, name: str, size: int, seed: int) -> None:
        self.name, self.size, self.seed = name, size, seed
        self._pass, self._index = 0, 0
        self._order: tuple[int, list[int]] = (-1, [])  # the current pass's order, computed once

    def order(self, pass_index: int) -> list[int]:
        order = list(range(self.size))
        random.Random(f"{self.seed}/{self.name}/{pass_index}").shuffle(order)
        return order

    def state(self) -> dict[str, int]:
        return {"pass": self._pass, "index": self._index}

    def restore(self, state: dict[str, int]) -> None:
        self._pass, self._index = state["pass"], state["index"]

    def next_item(self):
        if self._index == self.size:
            self._pass, self._index = self._pass + 1, 0
            return PASS_END
        if self._order[0] != self._pass:
            self._order = (self._pass, self.order(self._pass))
        i = self._order[1][self._index]
        self._index += 1
        return Item(f"{self.name}-{i}", {"prompt": f"question {i} of {self.name}", "answer": i * 7})


def producers(sizes, seed=0) -> list[ListProducer]:
    return [ListProducer(f"p{p}", size, seed) for p, size in enumerate(sizes)]


def expected_epoch(sizes, epoch, seed=0) -> list[tuple[str, dict]]:
    """Epoch ``epoch``'s merged stream as (key, payload), computed without the merge code."""
    orders = [ListProducer(f"p{p}", size, seed).order(epoch) for p, size in enumerate(sizes)]
    return [
        (f"p{p}-{order[r]}", {"prompt": f"question {order[r]} of p{p}", "answer": order[r] * 7})
        for r in range(max(sizes))
        for p, order in enumerate(orders)
        if r < len(order)
    ]


def ledger(sizes, window=64, seed=0, state=None) -> PromptLedger:
    """A ledger over freshly built producers, restored from ``state`` (a JSON round trip) if given."""
    built = PromptLedger(producers(sizes, seed), max_outstanding=window)
    if state is not None:
        built.load_state_dict(json.loads(json.dumps(state)))
    return built


def uids(taken) -> list[tuple[int, int]]:
    return [tuple(t.uid) for t in taken]


def test_merged_stream_is_the_interleave_with_a_new_order_every_epoch():
    sizes = (3, 1, 2)
    feed = ledger(sizes)
    taken = feed.take(18)
    assert uids(taken) == [(e, k) for e in range(3) for k in range(6)]
    for e in range(3):
        assert [(t.key, t.payload) for t in taken[6 * e : 6 * e + 6]] == expected_epoch(sizes, e)
    assert [t.key for t in taken[:6]] != [t.key for t in taken[6:12]]  # a new order per epoch
    assert [t.key for t in taken[:6]] == [t.key for t in ledger(sizes).take(6)]  # same uids, always


def test_long_rollout_in_flight_at_checkpoint_is_handed_out_again():
    feed = ledger((5, 3))
    taken = feed.take(8)
    feed.ack([t.uid for t in taken[1:]])  # uid (0, 0) is still generating a long rollout
    state = feed.state_dict()
    assert state["producers"] == [{"pass": 0, "index": 0}, {"pass": 0, "index": 0}]
    assert len(state["acked"]) == 7

    resumed = ledger((5, 3), state=state)
    again = resumed.take(1)
    assert again == taken[:1]  # same uid, key and payload
    assert uids(resumed.take(1)) == [(1, 0)]  # the acked prompts of epoch 0 are not handed out


def test_gap_fill_tail_is_not_lost_on_resume():
    feed = ledger((12,))
    taken = feed.take(10)
    feed.ack([t.uid for t in taken[:7]])  # the step needed 7; 3 are neither acked nor released
    resumed = ledger((12,), state=feed.state_dict())
    assert resumed.take(5) == taken[7:] + ledger((12,)).take(12)[10:]


def test_oversampled_untrained_prompts_survive_a_restore():
    feed = ledger((7, 9))
    taken = feed.take(16)
    trained = taken[1::2]
    feed.ack([t.uid for t in reversed(trained)])
    resumed = ledger((7, 9), state=feed.state_dict())
    assert resumed.take(8) == taken[0::2]  # in uid order
    assert uids(resumed.take(1)) == [(1, 0)]
    assert resumed.summary()["epochs"][0] == {
        "epoch": 0, "size": 16, "taken": 16, "rehanded": 8, "released": 0, "acked": 8, "dropped": {},
        "skipped": {}, "skipped_digest": 0, "outstanding": 8, "waiting": 0, "resolved_exactly_once": False,
    }  # fmt: skip


@pytest.mark.parametrize("last_outstanding", [False, True])
def test_epoch_ending_on_a_take_boundary_does_not_restart(last_outstanding):
    sizes = (2, 4)
    feed = ledger(sizes)
    taken = feed.take(6)  # exactly epoch 0
    feed.ack([t.uid for t in taken[: 5 if last_outstanding else 6]])
    resumed = ledger(sizes, state=feed.state_dict())
    epoch_1 = [(Uid(1, k), key, payload) for k, (key, payload) in enumerate(expected_epoch(sizes, 1))]
    got = [(t.uid, t.key, t.payload) for t in resumed.take(6)]
    assert got == [(t.uid, t.key, t.payload) for t in taken[5:6] if last_outstanding] + epoch_1[: 6 - last_outstanding]
    assert resumed.summary()["epochs"][0]["taken"] == 6


def test_resume_does_not_hand_out_a_resolved_prompt_again():
    feed = ledger((10,))
    taken = feed.take(10)
    feed.ack([t.uid for t in taken[5:]])
    feed.drop([taken[2].uid], reason="uniform_reward")
    feed.drop([taken[3].uid], reason="too_long")
    state = feed.state_dict()
    assert state["dropped"] == [[0, 2], [0, 3]] and state["acked"] == [[0, k] for k in range(5, 10)]

    resumed = ledger((10,), state=state)
    assert uids(resumed.take(4)) == [(0, 0), (0, 1), (0, 4), (1, 0)]
    with pytest.raises(UidStateError, match=r"uid \(0, 2\) .* already resolved \(dropped\)"):
        resumed.ack([(0, 2)])
    assert resumed.summary()["dropped"] == {"uniform_reward": 1, "too_long": 1}
    resumed.ack([(0, 0), (0, 1), (0, 4)])
    assert resumed.summary()["epochs"][0]["resolved_exactly_once"] is True


def test_release_hands_out_identical_content_first_in_uid_order():
    feed = ledger((4, 4))
    taken = feed.take(6)
    feed.release([taken[4].uid, taken[1].uid, taken[3].uid])
    feed.ack([taken[0].uid])
    again = feed.take(4)
    assert again[:3] == [taken[1], taken[3], taken[4]]
    assert uids(again[3:]) == [(0, 6)]
    counts = feed.summary()["epochs"][0]
    assert (counts["taken"], counts["released"], counts["rehanded"], counts["outstanding"]) == (7, 3, 3, 6)


def test_a_prompt_released_before_a_checkpoint_comes_back_first_after_restore():
    feed = ledger((4, 4))
    taken = feed.take(5)
    feed.release([taken[2].uid])
    feed.ack([t.uid for t in taken if t.uid != (0, 2)])
    resumed = ledger((4, 4), state=feed.state_dict())
    assert resumed.take(2) == [taken[2]] + ledger((4, 4)).take(6)[5:]
    assert resumed.summary()["epochs"][0]["rehanded"] == 1


def test_not_outstanding_uids_raise_clear_errors_and_change_nothing():
    feed = ledger((3,))
    taken = feed.take(4)  # (0, 0..2) and (1, 0)
    feed.ack([(0, 0)])
    cases = [
        (lambda: feed.ack([(0, 0)]), r"already resolved \(acked or dropped\)"),
        (lambda: feed.ack([(0, 7)]), r"unknown \(epoch 0 has 3 prompts\)"),
        (lambda: feed.drop([(1, 1)], "filtered"), "not handed out yet"),
        (lambda: feed.release([(0, 0)]), "already resolved"),
        (lambda: feed.ack([(0, 1), (0, 1)]), "named twice"),
        (lambda: feed.ack([(0, 1), (0, 0)]), r"uid \(0, 0\) \(the feed is in epoch 1\)"),
    ]
    for call, message in cases:
        before = feed.summary()
        with pytest.raises(UidStateError, match=message):
            call()
        assert feed.summary() == before  # all or nothing: (0, 1) was not acked
    feed.release([(0, 2)])
    with pytest.raises(UidStateError, match="released") as error:
        feed.ack([(0, 2)])
    assert (error.value.uid, error.value.state) == ((0, 2), "released (waiting to be handed out again)")
    with pytest.raises(ValueError, match="pair of ints"):
        feed.ack(["0-1"])
    with pytest.raises(ValueError, match="non-empty reason"):
        feed.drop([taken[1].uid], reason="")


def test_a_producer_error_during_take_loses_no_prompt():
    class Failing(ListProducer):
        calls = 0

        def next_item(self):
            Failing.calls += 1
            if Failing.calls == 3:
                raise ConnectionError("producer lost")
            return super().next_item()

    feed = PromptLedger([Failing("p0", 6, 0)], max_outstanding=8)
    with pytest.raises(ConnectionError):
        feed.take(5)
    assert feed.outstanding == 0 and feed.summary()["released_waiting"] == 2
    assert feed.take(5) == ledger((6,)).take(5)


def test_the_window_bounds_outstanding_prompts():
    feed = ledger((5, 5), window=4)
    assert len(feed.take(3)) == 3 and len(feed.take(3)) == 1 and feed.take(2) == []
    feed.ack([(0, 2)])
    feed.release([(0, 0)])
    assert uids(feed.take(5)) == [(0, 0), (0, 4)]
    assert feed.take(0) == [] and feed.outstanding == 4


def test_bookkeeping_shrinks_as_the_low_water_mark_advances():
    window, hold = 6, 20
    feed = ledger((4, 7, 2), window=window)
    held = feed.take(1)[0].uid  # a long rollout, resolved only after 20 more prompts
    largest = 0
    for step in range(80):
        for t in feed.take(window):
            feed.ack([t.uid])
        if step == hold:
            feed.ack([held])
        bookkeeping = feed.summary()["bookkeeping"]
        largest = max(largest, bookkeeping["pulls"], bookkeeping["uids"])
    span = (hold + 1) * (window - 1) + 1  # prompts pulled while the held one was outstanding
    assert hold * (window - 1) <= largest <= span + 3 * (span // 13 + 2)  # + 3 pass ends per epoch
    assert feed.summary()["bookkeeping"] == {"pulls": 0, "uids": 0}
    assert feed.state_dict()["acked"] == [] and feed.summary()["epoch"] >= 30


def test_checkpoint_is_plain_json_and_round_trips():
    feed = ledger((3, 2))
    feed.take(4)
    feed.ack([(0, 3)])
    state = feed.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert ledger((3, 2), state=state).state_dict() == state


def test_restore_refuses_other_producers_other_formats_and_a_started_ledger():
    state = ledger((3, 2)).state_dict()
    with pytest.raises(ValueError, match="holds 2 producer states, this ledger has 3 producers"):
        ledger((3, 2, 1), state=state)
    with pytest.raises(ValueError, match=r"not a prompt ledger state: in checkpoint: format='other' / expected: 'rl_data.prompt_feed.ledger'"):
        ledger((3, 2), state=state | {"format": "other"})
    with pytest.raises(ValueError, match="prompt ledger state format version: in checkpoint: 9 / this rl_data reads: 1"):
        ledger((3, 2), state=state | {"format_version": 9})
    with pytest.raises(ValueError, match=r"prompt ledger state is malformed: missing \['frontier'\], unknown \[\]"):
        ledger((3, 2), state={k: v for k, v in state.items() if k != "frontier"})
    started = ledger((3, 2))
    started.take(1)
    with pytest.raises(ValueError, match="build a new ledger"):
        started.load_state_dict(state)


def test_producers_that_changed_are_detected_on_replay():
    feed = ledger((4,))
    feed.take(5)
    feed.ack([(0, k) for k in range(1, 4)])
    with pytest.raises(ValueError, match="epoch 0 had 4 prompts .* has 5 after the restore"):
        ledger((5,), state=feed.state_dict()).take(10)


# --- seeded randomised interleavings, checked against a model and the expected stream ---


class Model:
    """What the consumers know: resolutions, hand-outs and counters (snapshotted at checkpoints)."""

    def __init__(self) -> None:
        self.resolved: dict[Uid, str] = {}  # uid -> "ack" or the drop reason
        self.taken: set[Uid] = set()
        self.counts: Counter = Counter()  # (epoch, "released" | "rehanded")

    def snapshot(self) -> "Model":
        copy = Model()
        copy.resolved, copy.taken, copy.counts = dict(self.resolved), set(self.taken), Counter(self.counts)
        return copy


def run_scenario(seed: int, producer_count: int) -> None:
    rng = random.Random(seed)
    sizes = [rng.randint(1, 6) for _ in range(producer_count)]
    window, callers = rng.randint(1, 8), rng.randint(1, 4)
    epochs = functools.cache(lambda e: expected_epoch(sizes, e, seed))
    epoch_size = sum(sizes)

    def succ(uid: Uid) -> Uid:
        return Uid(uid.epoch, uid.position + 1) if uid.position + 1 < epoch_size else Uid(uid.epoch + 1, 0)

    feed = ledger(sizes, window, seed)
    model, held, released = Model(), [set() for _ in range(callers)], []
    checkpoint, saved = feed.state_dict(), model.snapshot()
    next_new = Uid(0, 0)

    def take(caller: int, n: int) -> None:
        nonlocal next_new
        outstanding = sum(map(len, held))
        got = feed.take(n)
        assert len(got) == min(n, window - outstanding)
        for t in got:
            assert (t.key, t.payload) == epochs(t.uid.epoch)[t.uid.position]  # identical content, same uid
            assert t.uid not in model.resolved and all(t.uid not in h for h in held)  # no duplicate
            if released:  # released prompts first, in uid order
                assert t.uid == min(released)
                released.remove(t.uid)
            else:  # new prompts in uid order, skipping only resolved ones
                assert t.uid >= next_new
                while next_new < t.uid:
                    assert next_new in model.resolved, f"{next_new} unresolved but skipped"
                    next_new = succ(next_new)
                next_new = succ(t.uid)
            if t.uid in model.taken:
                model.counts[t.uid.epoch, "rehanded"] += 1
            model.taken.add(t.uid)
            held[caller].add(t.uid)

    def check_summary() -> None:
        summary = feed.summary()
        assert summary["outstanding"] == sum(map(len, held)) and summary["released_waiting"] == len(released)
        for counts in summary["epochs"]:
            e = counts["epoch"]
            resolutions = Counter(r for uid, r in model.resolved.items() if uid.epoch == e)
            acked = resolutions.pop("ack", 0)
            assert counts["size"] in (None, epoch_size)
            assert counts["taken"] == sum(uid.epoch == e for uid in model.taken)
            assert (counts["acked"], counts["dropped"]) == (acked, dict(resolutions))
            assert (counts["released"], counts["rehanded"]) == (model.counts[e, "released"], model.counts[e, "rehanded"])
            assert counts["outstanding"] == sum(uid.epoch == e for h in held for uid in h)

    for _ in range(rng.randint(30, 120)):
        caller, op = rng.randrange(callers), rng.choices(
            ["take", "ack", "drop", "release", "checkpoint", "restore", "wrong"], [30, 25, 8, 10, 8, 5, 4]
        )[0]
        mine = sorted(held[caller])
        chosen = rng.sample(mine, rng.randint(1, len(mine))) if mine else []
        if op == "take":
            take(caller, rng.randint(0, window + 2))
        elif op in ("ack", "drop") and chosen:
            reason = rng.choice(["uniform_reward", "too_long"])
            feed.ack(chosen) if op == "ack" else feed.drop(chosen, reason)
            model.resolved |= {uid: "ack" if op == "ack" else reason for uid in chosen}
            held[caller] -= set(chosen)
        elif op == "release" and chosen:
            feed.release(chosen)
            held[caller] -= set(chosen)
            released.extend(chosen)
            model.counts.update((uid.epoch, "released") for uid in chosen)
        elif op == "checkpoint":
            checkpoint, saved = feed.state_dict(), model.snapshot()
        elif op == "restore":  # everything dies; consumers go back to their own checkpoint too
            feed, model, held, released = ledger(sizes, window, seed, checkpoint), saved.snapshot(), [set() for _ in held], []
            next_new = Uid(0, 0)
            while next_new in model.resolved:
                next_new = succ(next_new)
        elif op == "wrong" and model.resolved:
            with pytest.raises(UidStateError, match="already resolved"):
                feed.ack([rng.choice(sorted(model.resolved))])
        check_summary()

    # Drain: resolve everything and go on until three whole epochs are resolved and over.
    for caller in range(callers):
        feed.ack(sorted(held[caller]))
        model.resolved |= dict.fromkeys(held[caller], "ack")
        held[caller].clear()
    for _ in range(10 * epoch_size + 50):
        if feed.epoch >= 3 and all(Uid(e, k) in model.resolved for e in range(3) for k in range(epoch_size)):
            break
        take(0, window)
        feed.ack(sorted(held[0]))
        model.resolved |= dict.fromkeys(held[0], "ack")
        held[0].clear()
    check_summary()
    for e in range(3):  # nothing missing, nothing twice (a second resolution raises)
        assert sorted(uid for uid in model.resolved if uid.epoch == e) == [Uid(e, k) for k in range(epoch_size)]
        assert feed.summary()["epochs"][e]["resolved_exactly_once"] is True


@pytest.mark.parametrize("producer_count", [1, 2, 3])
def test_random_interleavings_are_exactly_once(producer_count):
    for seed in range(70):
        try:
            run_scenario(seed, producer_count)
        except Exception as error:
            error.add_note(f"scenario seed={seed} producers={producer_count}")
            raise


@pytest.mark.parametrize("collector_on", [True, False])
def test_a_checkpoint_with_many_resolved_uids_round_trips_and_leaves_the_collector_as_it_was(collector_on):
    """``state_dict`` / ``load_state_dict`` build their uids with the garbage collector paused
    (``collector_paused``: 10-20x faster with 50,000 uids) and switch it back only if it was on."""
    import gc

    source = ledger([300, 300], window=600)
    taken = source.take(500)
    source.ack([p.uid for p in taken[1::2]])  # out of order: 250 resolved above the low-water mark
    source.drop([taken[2].uid], "too_easy")
    was = gc.isenabled()
    (gc.enable if collector_on else gc.disable)()
    try:
        state = source.state_dict()
        restored = ledger([300, 300], window=600, state=state)
        assert gc.isenabled() is collector_on
    finally:
        (gc.enable if was else gc.disable)()
    assert state["acked"] == [list(p.uid) for p in taken[1::2]] and state["dropped"] == [list(taken[2].uid)]
    unresolved = [p.uid for i, p in enumerate(taken) if i % 2 == 0 and i != 2]
    assert uids(restored.take(len(unresolved))) == [tuple(uid) for uid in unresolved]
