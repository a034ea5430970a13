"""The stateful contract's envelope: built, opened, and refused with what was found and expected."""

from __future__ import annotations

import pytest

from rl_data.stateful import KEY_FORMAT, KEY_VERSION, envelope, open_envelope


def test_an_envelope_round_trips_its_fields():
    state = envelope("rl_data.thing", 3, {"step": 4, "ranks": [1, 2]})
    assert state == {KEY_FORMAT: "rl_data.thing", KEY_VERSION: 3, "step": 4, "ranks": [1, 2]}
    assert open_envelope(state, fmt="rl_data.thing", version=3, what="thing", fields=("step", "ranks")) == {"step": 4, "ranks": [1, 2]}


def test_the_loaders_reference_format_names_its_format_under_backend():
    state = envelope("energon", 2, {"loader_state": b""}, format_key="backend")
    assert state["backend"] == "energon" and KEY_FORMAT not in state
    assert open_envelope(state, fmt="energon", version=2, what="loader", format_key="backend") == {"loader_state": b""}


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ([1, 2], r"^not a thing state: found a list, expected a dict with format='rl_data.thing'$"),
        ({KEY_FORMAT: "other", KEY_VERSION: 3}, r"^not a thing state: in checkpoint: format='other' / expected: 'rl_data.thing'$"),
        ({KEY_FORMAT: "rl_data.thing", KEY_VERSION: 2}, r"^thing state format version: in checkpoint: 2 / this rl_data reads: 3; restore it with"),
        ({KEY_FORMAT: "rl_data.thing", KEY_VERSION: 3, "step": 1, "extra": 0},
         r"^thing state is malformed: missing \['ranks'\], unknown \['extra'\]; it was not written by"),
    ],
)
def test_a_state_of_another_format_version_or_shape_is_refused(state, message):
    with pytest.raises(ValueError, match=message):
        open_envelope(state, fmt="rl_data.thing", version=3, what="thing", fields=("step", "ranks"))


def test_fields_cannot_overwrite_the_envelope():
    with pytest.raises(ValueError, match=r"state fields \['format_version'\] would overwrite the envelope's own keys"):
        envelope("rl_data.thing", 1, {KEY_VERSION: 7})


def test_every_stateful_part_declares_its_format_and_checkpoint_calls():
    from rl_data.distributed.coordinator import DataCoordinator
    from rl_data.distributed.rank_actor import RankActor
    from rl_data.energon.sft_dataloader import EnergonSFTDataLoader
    from rl_data.prompt_feed.feed import PromptFeed
    from rl_data.prompt_feed.ledger import PromptLedger

    formats = {}
    for part in (EnergonSFTDataLoader, RankActor, DataCoordinator, PromptFeed, PromptLedger):
        assert callable(part.state_dict) and callable(part.load_state_dict), part
        formats[part.__name__] = (part.STATE_FORMAT, part.STATE_VERSION)
    assert formats == {
        "EnergonSFTDataLoader": ("energon", 2),
        "RankActor": ("energon", 2),  # a rank's state is its loader's
        "DataCoordinator": ("rl_data.distributed.coordinator", 1),
        "PromptFeed": ("rl_data.prompt_feed", 1),
        "PromptLedger": ("rl_data.prompt_feed.ledger", 1),
    }
