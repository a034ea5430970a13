"""``EpochBook``: per-epoch counts, the old resolved epochs folded into one sum (pure)."""

from __future__ import annotations

import json
import pickle

import pytest
from test_prompt_ledger import producers

from rl_data.prompt_feed.epoch_book import EpochBook, EpochCounts
from rl_data.prompt_feed.ledger import PromptLedger
from rl_data.prompt_feed.outcomes import keys_digest


def ended_epoch(book: EpochBook, epoch: int, resolved_below: int) -> None:
    """Epoch ``epoch`` of 4 prompts: 2 acked, 1 dropped, 1 skipped; then its stream ends."""
    counts = book[epoch]
    counts.taken, counts.acked = 3, 2
    counts.dropped["too_long"] = 1
    counts.skip("retired", f"key-{epoch}")
    book.end(epoch, 4, resolved_below=resolved_below)


def test_only_the_newest_ended_epochs_are_kept_and_the_totals_count_every_epoch():
    book = EpochBook(kept_epochs=3)
    for epoch in range(10):
        ended_epoch(book, epoch, resolved_below=epoch + 1)
    assert sorted(book.epochs) == [7, 8, 9]
    summary = book.summary({})
    earlier = summary["earlier_epochs"]
    assert earlier["epochs"] == [0, 6] and earlier["resolved_exactly_once"] is True
    assert (earlier["size"], earlier["taken"], earlier["acked"], earlier["dropped"]) == (28, 21, 14, {"too_long": 7})
    assert earlier["skipped"] == {"retired": 7} and earlier["skipped_digest"] == keys_digest(f"key-{e}" for e in range(7))
    assert summary["dropped"] == {"too_long": 10} and summary["skipped"] == {"retired": 10}
    with pytest.raises(KeyError, match=r"epoch 3 is folded into epochs \[0, 6\]"):
        book[3]


def test_an_epoch_with_unresolved_prompts_is_never_folded():
    book = EpochBook(kept_epochs=1)
    for epoch in range(6):
        ended_epoch(book, epoch, resolved_below=2)  # the low-water mark stays in epoch 2
    assert sorted(book.epochs) == [2, 3, 4, 5] and book.earlier[0] == [0, 1]


def test_the_book_round_trips_and_refuses_damaged_state():
    book = EpochBook(kept_epochs=2)
    for epoch in range(5):
        ended_epoch(book, epoch, resolved_below=epoch + 1)
    listed, earlier = json.loads(json.dumps(book.to_json()))
    restored = EpochBook(kept_epochs=2)
    restored.load(listed, earlier)
    assert restored.summary({}) == book.summary({})
    with pytest.raises(ValueError, match=r"folds epochs \[3, 1\], expected \[first, last\]"):
        EpochBook().load(listed, {**earlier, "epochs": [3, 1]})
    with pytest.raises(ValueError, match=r"lists epoch 3 and folds epochs \[0, 3\]; it is damaged"):
        EpochBook().load(listed, {**earlier, "epochs": [0, 3]})
    with pytest.raises(ValueError, match=r"expected a mapping with keys \['epoch', 'size', 'taken'"):
        EpochBook().load([{"epoch": 0, "sise": 4}], None)
    with pytest.raises(ValueError, match="kept_epochs must be an int >= 1"):
        EpochBook(kept_epochs=0)
    counts = EpochCounts(size=4)
    book = EpochBook()
    book.epochs[0] = counts
    with pytest.raises(ValueError, match="epoch 0 had 4 prompts when the checkpoint was saved and has 5"):
        book.end(0, 5, resolved_below=0)


def test_a_ledger_checkpoint_stays_the_same_size_however_many_epochs_it_read():
    """200 epochs of 3 prompts, each acked: with 4 kept epochs the checkpoint and the summary stop
    growing; a restore from any of them goes on exactly (the stream of a fresh, unfolded ledger)."""
    sizes = (2, 1)

    def run(kept: int, epochs: int) -> tuple[PromptLedger, list]:
        ledger = PromptLedger(producers(sizes, 0), max_outstanding=8, kept_epochs=kept)
        states = []
        for _ in range(epochs):
            taken = ledger.take(3)
            ledger.ack([t.uid for t in taken])
            states.append(ledger.state_dict())
        return ledger, states

    folded, states = run(4, 200)
    sizes_in_bytes = [len(pickle.dumps(states[e])) for e in (50, 100, 199)]
    assert max(sizes_in_bytes) - min(sizes_in_bytes) <= 16, sizes_in_bytes  # larger numbers only
    _, unfolded = run(1000, 200)
    assert len(pickle.dumps(unfolded[199])) - len(pickle.dumps(unfolded[50])) > 20 * 149  # ~32 bytes per epoch pickled
    summary = folded.summary()
    assert len(summary["epochs"]) <= 6 and summary["earlier_epochs"]["acked"] + sum(e["acked"] for e in summary["epochs"]) == 600
    reference = PromptLedger(producers(sizes, 0), max_outstanding=8, kept_epochs=1000)
    stream = [(t.uid, t.key) for _ in range(210) for t in reference.take(3) if reference.ack([t.uid]) is None]
    for epoch in (3, 57, 198):
        resumed = PromptLedger(producers(sizes, 0), max_outstanding=8, kept_epochs=4)
        resumed.load_state_dict(json.loads(json.dumps(states[epoch])))
        assert [(t.uid, t.key) for t in resumed.take(6)] == stream[3 * (epoch + 1) : 3 * (epoch + 1) + 6]
