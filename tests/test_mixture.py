"""Weighted mixtures of three real Energon datasets through the loader: identity, proportions,
exact restore, refused and explicit re-weighting (no Ray)."""

from __future__ import annotations

from collections import Counter

import pytest
from energon_fixtures import (
    SINGLE_RANK_UNPACKED,
    batch_source_ids,
    make_loader,
    write_chat_dataset,
)
from restore_check import assert_restores_at_every_step, torch_roundtrip

from rl_data.config_blocks import ConfigError
from rl_data.energon.config import EnergonSourceConfig
from rl_data.energon.sft_dataloader import build_energon_sft_loader
from rl_data.energon.compat import internals
from rl_data.energon.compat.loader import watchdog_of

WEIGHTS = {"math": 0.5, "code": 0.3, "chat": 0.2}
#: Batches of 4 of up to 256 tokens, small shuffle buffers.
LOADER = {"energon": {"shuffle_buffer_size": 8, "max_samples_per_sequence": 4}, "batch_size": 4, "max_sequence_length": 256}


@pytest.fixture(scope="module")
def members(tmp_path_factory, chat_conversations):
    """Three datasets of different conversations (disjoint sample keys), all in split train."""
    out = {}
    for index, name in enumerate(WEIGHTS):
        root = tmp_path_factory.mktemp(f"mixture_{name}")
        out[name] = write_chat_dataset(root, chat_conversations[300 * index : 300 * index + 300],
                                       samples_per_shard=30, splits={"train": 1.0})
    return out


def _mixture(members, weights=WEIGHTS):
    return [{"name": name, "path": str(members[name].path), "weight": w} for name, w in weights.items()]


def _source(members, *, weights=WEIGHTS, loop=20):
    """The mixture of ``members`` with ``weights``, read in loops of ``loop`` batches."""
    return {"mixture": _mixture(members, weights), "epoch_mode": "virtual", "virtual_epoch_length": loop}


def _member_of(members):
    return {key: name for name, dataset in members.items() for key in dataset.split_keys["train"]}


def test_source_config_takes_a_path_or_a_mixture_never_both(members):
    with pytest.raises(ValueError, match="give exactly one of path .* and mixture"):
        EnergonSourceConfig(path="/d", mixture=_mixture(members), split="train")
    with pytest.raises(ValueError, match=r"mixture member names must be unique, found \['math'\]"):
        EnergonSourceConfig(mixture=_mixture(members)[:1] * 2, split="train")
    with pytest.raises(ValueError, match="weight"):
        EnergonSourceConfig(mixture=[{"name": "a", "path": "/d", "weight": 0}], split="train")


def test_exact_passes_are_refused_for_a_mixture(members, tokenizer):
    with pytest.raises(ConfigError, match=r"a mixture samples its members by weight .* set source epoch_mode 'virtual'"):
        build_energon_sft_loader(
            data_config={"energon": {}, "shuffle": True}, source={"mixture": _mixture(members), "split": "train"},
            processor=tokenizer, batch_size=4, max_sequence_length=256, split_role="train", **SINGLE_RANK_UNPACKED,
        )


def test_identity_names_every_member_with_its_weight_and_dataset(members, tokenizer):
    loader = make_loader(None, tokenizer, **LOADER, source=_source(members))
    mixture = loader.identity["mixture"]
    assert list(mixture) == ["math", "code", "chat"]
    for name, weight in WEIGHTS.items():
        assert mixture[name]["weight"] == weight and mixture[name]["path"] == str(members[name].path)
        assert mixture[name]["index_uuid"] == (members[name].root / ".nv-meta" / "index.uuid").read_text().strip()
    assert "mixture" not in loader.identity["source"]
    loader.close()


def test_member_proportions_over_5000_samples_follow_the_weights(members, tokenizer):
    loader, member_of = make_loader(None, tokenizer, **LOADER, source=_source(members, loop=1250)), _member_of(members)
    batches = list(loader)
    counts = Counter(member_of[key] for batch in batches for key in batch["source_ids"])
    assert sum(counts.values()) == 5000
    for name, weight in WEIGHTS.items():  # binomial sd <= 0.0071: 3 % is over 4 sd
        assert abs(counts[name] / 5000 - weight) < 0.03, (name, counts)
    # the loader's own per-member count (source_datasets column) agrees with the sample ids
    assert all(batch["source_datasets"] == [member_of[k] for k in batch["source_ids"]] for batch in batches)
    assert loader.mixture["counts"] == dict(counts) and loader.mixture["batches"] == 1250
    # each member read ~5 times over: its open shards keep no tar member (compat fix 4, one reader per member)
    readers = internals.tar_readers(watchdog_of(loader._loader.dataset))
    assert len(readers) == 3 and sum(len(tar.members) for r in readers for tar in r.itar_files_cache.values()) == 0
    loader.close()


@pytest.mark.parametrize("packing", [False, True], ids=["unpacked", "packed"])
def test_restore_at_every_step_equals_the_uninterrupted_run(members, tokenizer, packing):
    report = assert_restores_at_every_step(
        lambda: make_loader(None, tokenizer, **LOADER, source=_source(members, loop=5), packing_buffer=6 if packing else None),
        steps=12, extract=batch_source_ids,
        close=lambda loader: loader.close(),
    )
    assert len(report.epoch_starts) >= 1  # across for-loop boundaries
    assert len(set(_member_of(members)[i] for i in report.ids)) == 3


def test_restore_at_every_step_with_energon_workers(members, tokenizer):
    assert_restores_at_every_step(
        lambda: make_loader(None, tokenizer, **LOADER, source=_source(members, loop=4), workers=2),
        steps=9, extract=batch_source_ids,
        close=lambda loader: loader.close(),
    )


def _run(loader, batches):
    iterator, out = iter(loader), []
    while len(out) < batches:
        try:
            out.append(next(iterator))
        except StopIteration:
            iterator = iter(loader)
    return out


def test_changed_weights_are_refused_with_one_line_per_weight(members, tokenizer):
    loader = make_loader(None, tokenizer, **LOADER, source=_source(members))
    _run(loader, 3)
    state = torch_roundtrip(loader.state_dict())
    loader.close()
    other = make_loader(None, tokenizer, **LOADER, source=_source(members, weights={"math": 0.2, "code": 0.3, "chat": 0.5}))
    with pytest.raises(ValueError) as refused:
        other.load_state_dict(state)
    assert str(refused.value) == (
        "Energon loader identity changed: mixture.chat.weight 0.2 -> 0.5; mixture.math.weight 0.5 -> 0.2; "
        "only mixture weights changed: to continue with the new weights from each member's restored "
        "position, restore with reweight=True"
    )
    # re-weighting never excuses another change: a new member is refused even with reweight=True
    more = make_loader(None, tokenizer, **LOADER, source=_source(members, weights={"math": 0.5, "code": 0.3}))
    with pytest.raises(ValueError, match=r"^Energon loader identity changed: mixture.chat removed \{'path'") as removed:
        more.load_state_dict(state, reweight=True)
    assert "reweight" not in str(removed.value)
    other.close()
    more.close()


def test_explicit_reweighting_continues_from_each_members_position_without_repeats(members, tokenizer):
    member_of = _member_of(members)
    loader = make_loader(None, tokenizer, **LOADER, source=_source(members))
    before = _run(loader, 25)  # 100 samples: no member is near the end of its 300
    state = torch_roundtrip(loader.state_dict())
    loader.close()
    new_weights = {"math": 0.1, "code": 0.1, "chat": 0.8}
    resumed = make_loader(None, tokenizer, **LOADER, source=_source(members, weights=new_weights))
    resumed.load_state_dict(state, reweight=True)
    after = _run(resumed, 25)
    ids = [k for batch in before + after for k in batch["source_ids"]]
    assert len(ids) == len(set(ids)) == 200  # no member sample twice in its current pass
    share = Counter(member_of[k] for batch in after for k in batch["source_ids"])
    assert share["chat"] > share["math"] + share["code"]  # the new weights are in force
    record = resumed.mixture
    assert record["history"] == [{"batches": 0, "weights": WEIGHTS}, {"batches": 25, "weights": new_weights}]
    assert record["batches"] == 50 and sum(record["counts"].values()) == 200
    saved = resumed.state_dict()
    assert saved["mixture"]["history"][-1] == {"batches": 25, "weights": new_weights}
    assert saved["identity"]["mixture"]["chat"]["weight"] == 0.8
    resumed.close()



def test_exact_passes_over_a_metadataset_blend_are_refused(members, tokenizer, tmp_path):
    from rl_data.preprocess.mixture import write_mixture_file

    for name, dataset in members.items():  # the mixture file's members sit next to it
        (tmp_path / name).symlink_to(dataset.root)
    mixture = write_mixture_file(tmp_path / "mixture.yaml", WEIGHTS, ["train"])
    with pytest.raises(ConfigError, match=r"mixture.yaml' has epoch_mode 'exact', but a mixture samples its members by weight .* no exact passes"):
        build_energon_sft_loader(
            data_config={"energon": {}, "shuffle": True}, source={"path": str(mixture), "split": "train"},
            processor=tokenizer, batch_size=4, max_sequence_length=256, split_role="train", **SINGLE_RANK_UNPACKED,
        )
