"""StepBook (pure, no Ray): the coordinator's hand-out, commit and checkpoint rules."""

from __future__ import annotations

import pytest

from rl_data.distributed.step_book import StepBook


def _states(tag: str) -> list[dict]:
    return [{"rank": rank, "after": tag} for rank in range(2)]


def _book() -> StepBook:
    book = StepBook()
    book.reset(0, _states("start"), origin=True)
    for step in (1, 2, 3):
        assert book.step_to_hand_out(None) == step
        assert book.hand_out([f"ref{step}.0", f"ref{step}.1"], _states(f"step{step}")) == step
    return book


def test_steps_are_pending_until_committed_and_a_commit_keeps_the_states_after_it():
    book = _book()
    assert (book.committed_step, book.handed_step, book.pending_range()) == (0, 3, "1..3")
    assert book.commit(2) == [1, 2] and book.commit(2) == []  # again: a no-op
    assert (book.committed_states, sorted(book.pending), book.pending_range()) == (_states("step2"), [3], "3..3")
    with pytest.raises(ValueError, match=r"^cannot commit step 1: step 2 is already committed$"):
        book.commit(1)
    with pytest.raises(ValueError, match=r"^cannot commit step 4: the last step handed out is 3; commit only steps returned by next_step$"):
        book.commit(4)
    assert book.origin == (0, _states("start"))


def test_a_consumer_gets_a_pending_step_again_or_the_next_one_never_another():
    book = _book()
    book.commit(1)
    assert [book.step_to_hand_out(k) for k in (2, 3, 4)] == [2, 3, 4]
    with pytest.raises(ValueError, match=r"^cannot hand out step 1: step 1 is already committed; the pending steps are 2..3 and the next new step is 4; ask for one of those$"):
        book.step_to_hand_out(1)
    with pytest.raises(ValueError, match=r"^cannot hand out step 5: the pending steps are 2..3 and the next new step is 4"):
        book.step_to_hand_out(5)
    book.check_pending(3)
    with pytest.raises(ValueError, match=r"^cannot re-deliver step 4: the pending steps \(handed out, not committed\) are 2..3; ask next_step for a new step$"):
        book.check_pending(4)


def test_checkpoints_of_the_committed_or_a_pending_step_and_their_completed_states():
    book = _book()
    book.commit(1)
    assert book.states_at(None) == book.states_at(1) == (1, _states("step1"))
    step, states = book.states_at(3)
    assert (step, states) == (3, _states("step3"))
    with pytest.raises(ValueError, match=r"^no checkpoint of step 0: the last committed step is 1 and the pending steps are 2..3$"):
        book.states_at(0)
    completed = {"rank": 1, "after": "step3", "complete": True}
    book.replace_state(3, 1, states[1], completed)  # kept for the commit of step 3
    book.replace_state(3, 1, {"another": "state"}, {"never": "kept"})  # not the state it keeps: ignored
    book.commit(3)
    assert book.committed_states == [_states("step3")[0], completed]


def test_a_replacement_reproduces_pending_batches_and_a_restore_starts_over():
    book = _book()
    book.reproduced(2, 0, "fresh-ref", {"rank": 0, "after": "step2"})
    assert book.pending[2][0] == ["fresh-ref", "ref2.1"]
    book.commit(2)
    book.reproduced(2, 0, "late-ref", {})  # committed meanwhile: nothing to replace
    assert 2 not in book.pending
    book.reset(5, _states("checkpoint"), origin=False)  # a rewind keeps the origin
    assert (book.committed_step, book.handed_step, book.pending, book.origin) == (5, 5, {}, (0, _states("start")))
    assert book.step_to_hand_out(None) == 6
    book.reset(1, _states("restored"), origin=True)
    assert book.origin == (1, _states("restored"))


class _Ref:
    """Stands for an ObjectRef: the test sees when the book lets go of it (a weak reference dies)."""


def test_a_step_done_with_keeps_its_refs_for_the_release_delay_then_lets_go():
    import gc
    import weakref

    book = StepBook(release_delay=2)
    book.reset(0, _states("start"), origin=True)
    alive = {}
    for step in range(1, 6):
        refs = [_Ref(), _Ref()]
        alive[step] = [weakref.ref(ref) for ref in refs]
        book.hand_out(refs, _states(f"step{step}"))
    del refs

    def held_steps() -> list[int]:
        gc.collect()
        return [step for step, weak in alive.items() if all(w() is not None for w in weak)]

    book.commit(1)
    assert held_steps() == [1, 2, 3, 4, 5] and len(book.released) == 2  # 1 delayed, 2..5 pending
    book.commit(3)  # one group per step: a commit of many steps keeps only the last two
    assert held_steps() == [2, 3, 4, 5] and len(book.released) == 4
    book.reset(3, _states("step3"), origin=False)  # a rewind: the pending steps 4, 5 are delayed too
    assert held_steps() == [4, 5] and len(book.released) == 4
    assert StepBook().released.__len__() == 0  # no delay by default: nothing is held after a commit
