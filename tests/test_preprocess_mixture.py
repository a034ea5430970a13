"""Preprocess several inputs as a weighted mixture in one job (real Ray, real files), then load it."""

from __future__ import annotations

from collections import Counter

import pytest
import yaml
from preprocess_fixtures import write_jsonl
from typer.testing import CliRunner

from rl_data.cli import app
from rl_data.preprocess.pipeline import PreprocessConfig
from rl_data.preprocess.mixture import MIXTURE_FILE, inputs_by_member, parse_mixture, run_mixture_preprocess

pytestmark = pytest.mark.timeout(300)
WEIGHTS = {"math": 0.5, "code": 0.3, "chat": 0.2}


def test_parse_mixture_from_text_and_yaml(tmp_path):
    assert parse_mixture("math=0.5, code=0.3,chat=0.2") == WEIGHTS
    (tmp_path / "mix.yaml").write_text("a: 2\nb: 1\n")
    assert parse_mixture(str(tmp_path / "mix.yaml")) == {"a": 2.0, "b": 1.0}
    for bad, message in (("math", "expected NAME=WEIGHT"), ("a=0", "weights are numbers > 0"), ("a=x", "expected a number"),
                         ("a=1,a=2", "unique"), ("a b=1", "names are letters")):
        with pytest.raises(ValueError, match=message):
            parse_mixture(bad)


def test_inputs_belong_to_the_member_they_are_named_after():
    grouped = inputs_by_member(["/d/math.jsonl", "/d/math-2.jsonl", "/d/code/", "/x/chat_part.parquet", "/d/mathx.jsonl"],
                               ["math", "code", "chat", "mathx"])
    assert grouped == {"math": ["/d/math.jsonl", "/d/math-2.jsonl"], "code": ["/d/code/"],
                       "chat": ["/x/chat_part.parquet"], "mathx": ["/d/mathx.jsonl"]}
    with pytest.raises(ValueError, match=r"inputs \['/d/other.jsonl'\] belong to no mixture member"):
        inputs_by_member(["/d/math.jsonl", "/d/other.jsonl"], ["math"])
    with pytest.raises(ValueError, match=r"mixture members \['code'\] have no input"):
        inputs_by_member(["/d/math.jsonl"], ["math", "code"])


@pytest.fixture(scope="module")
def raw_members(tmp_path_factory, chat_conversations):
    root = tmp_path_factory.mktemp("raw_mixture")
    for index, name in enumerate(WEIGHTS):
        rows = [{"messages": c["messages"]} for c in chat_conversations[100 * index : 100 * index + 100]]
        write_jsonl(root / f"{name}.jsonl", rows)
    return root


def test_members_and_the_mixture_file_are_written_and_load_by_weight(ray_session, raw_members, tmp_path, tokenizer):
    from rl_data.energon.sft_dataloader import build_energon_sft_loader
    from energon_fixtures import SINGLE_RANK_UNPACKED

    inputs = [str(raw_members / f"{name}.jsonl") for name in WEIGHTS]
    config = PreprocessConfig(inputs=inputs, output=str(tmp_path / "mix"), splits={"train": 1.0}, target_shard_rows=10, progress=False)
    summary = run_mixture_preprocess(config, WEIGHTS)
    assert summary.weights == WEIGHTS and {n: m["accepted"] for n, m in summary.members.items()} == {n: 100 for n in WEIGHTS}
    for name in WEIGHTS:
        assert (tmp_path / "mix" / name / ".nv-meta" / "index.uuid").is_file()
    mixture = yaml.safe_load((tmp_path / "mix" / MIXTURE_FILE).read_text())
    assert mixture["splits"]["train"]["blend"] == [{"weight": w, "path": n} for n, w in WEIGHTS.items()]
    assert not list(tmp_path.glob(".mix.partial-*"))

    loader = build_energon_sft_loader(
        data_config={"energon": {"shuffle_buffer_size": 8, "max_samples_per_sequence": 4}, "shuffle": True},
        source={"path": summary.mixture_file, "split": "train", "epoch_mode": "virtual", "virtual_epoch_length": 250},
        processor=tokenizer, batch_size=4, max_sequence_length=256, split_role="train", **SINGLE_RANK_UNPACKED,
    )
    identity = loader.identity["mixture"]
    assert {n: (m["weight"], m["path"]) for n, m in identity.items()} == {n: (w, str(tmp_path / "mix" / n)) for n, w in WEIGHTS.items()}
    counts = Counter(name for batch in loader for name in batch["source_datasets"])
    assert sum(counts.values()) == 1000 and all(abs(counts[n] / 1000 - w) < 0.06 for n, w in WEIGHTS.items()), counts
    assert loader.mixture["counts"] == dict(counts)
    loader.close()


def test_a_failing_member_leaves_no_output(ray_session, raw_members, tmp_path):
    broken = tmp_path / "chat.jsonl"
    broken.write_text('{"messages": "not a list"}\n' * 20)  # every row fails: over the failure budget
    inputs = [str(raw_members / "math.jsonl"), str(raw_members / "code.jsonl"), str(broken)]
    config = PreprocessConfig(inputs=inputs, output=str(tmp_path / "mix"), splits={"train": 1.0},
                              max_failed_rows=0, max_failed_fraction=0.0, progress=False)
    with pytest.raises(Exception, match="failed"):
        run_mixture_preprocess(config, WEIGHTS)
    assert not (tmp_path / "mix").exists() and not list(tmp_path.glob(".mix.partial-*"))


def test_the_cli_writes_a_mixture(ray_session, raw_members, tmp_path):
    result = CliRunner().invoke(app, [
        "preprocess", str(raw_members / "math.jsonl"), str(raw_members / "code.jsonl"), "-o", str(tmp_path / "m"),
        "--mixture", "math=2,code=1", "--splits", "train=1.0", "--no-progress",
    ])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"mixture written: {tmp_path / 'm' / MIXTURE_FILE} blends math=2 (100 samples), code=1 (100 samples)" in result.output
