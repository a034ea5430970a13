"""The whole job on real Ray and real files: quarantine, determinism, formats, atomicity, loading."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from preprocess_fixtures import GSM8K_ROW, read_quarantine, read_shards, write_jsonl

from rl_data.config_blocks import ConfigError
from rl_data.energon import dataset_writer
from rl_data.preprocess.pipeline import PreprocessConfig, run_preprocess
from rl_data.preprocess.pipeline import load_dataset_info
from rl_data.preprocess.transform import sample_key, token_length

pytestmark = pytest.mark.timeout(240)
MAX_TOKENS = 1500
GOOD_PER_FILE = 30


def run(inputs, output, **overrides):
    config = PreprocessConfig(inputs=[str(i) for i in inputs], output=str(output), progress=False, **overrides)
    return run_preprocess(config)


def bad_rows():
    """One raw row per rejection reason, with the reason it must get."""
    user, assistant = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}
    return [
        ('{"messages": [{"role": "user", "content": "cut off', "invalid_json"),
        ({"messages": "hello there"}, "missing_field"),
        ({"messages": [{"role": "human", "content": "hi"}, assistant]}, "invalid_role"),
        ({"messages": [user, {"role": "assistant", "content": {"text": "hello"}}]}, "non_text_content"),
        ({"messages": [user, {"role": "assistant", "content": ""}]}, "empty_content"),
        ({"messages": [{"role": "system", "content": "be nice"}, user]}, "no_assistant_turn"),
        ({"messages": [user, assistant, {"role": "tool", "content": "42"}]}, "invalid_message"),
        ({"messages": [user, {"role": "assistant", "content": "word " * 2000}]}, "too_long"),
    ]


@pytest.fixture(scope="module")
def mixed_input(tmp_path_factory, chat_conversations, tokenizer):
    """Two JSONL files of real conversations with bad rows spliced in, and the expected outcome."""
    folder = tmp_path_factory.mktemp("mixed")
    expected_good, expected_bad = {}, {}
    conversations = iter(chat_conversations)
    for name in ("part-a.jsonl", "part-b.jsonl"):
        rows = []
        bad = iter(bad_rows())
        for index in range(GOOD_PER_FILE + len(bad_rows())):
            if index % 4 == 1 and (entry := next(bad, None)):
                rows.append(entry[0])
                expected_bad[(name, index)] = entry[1]
                continue
            messages = next(conversations)["messages"]
            rows.append({"messages": messages, "id": f"{name}-{index}"})
            sample = {"kind": "sft", "messages": messages}
            if token_length(sample, tokenizer) > MAX_TOKENS:
                expected_bad[(name, index)] = "too_long"
            else:
                expected_good[sample_key(name, index)] = {**sample, "source": {"file": name, "row": index}}
        write_jsonl(folder / name, rows)
    return folder, expected_good, expected_bad


@pytest.fixture(scope="module")
def mixed_run(ray_session, mixed_input, tmp_path_factory):
    folder, _, _ = mixed_input
    output = tmp_path_factory.mktemp("out") / "dataset"
    summary = run([folder / "*.jsonl"], output, max_tokens=MAX_TOKENS, target_shard_rows=4)
    return output, summary


def test_every_bad_row_is_quarantined_and_every_good_row_written_once(mixed_input, mixed_run):
    _, expected_good, expected_bad = mixed_input
    output, summary = mixed_run
    quarantine = read_quarantine(output)
    assert {(q["file"], q["row"]): q["reason"] for q in quarantine} == expected_bad
    assert len(quarantine) == len(expected_bad)
    assert all(q["message"] and q["raw"] for q in quarantine)
    samples = read_shards(output)
    assert samples == expected_good
    reasons = {}
    for reason in expected_bad.values():
        reasons[reason] = reasons.get(reason, 0) + 1
    assert (summary.read, summary.accepted, summary.quarantined) == (
        len(expected_good) + len(expected_bad), len(expected_good), len(expected_bad))
    assert summary.quarantined_by_reason == dict(sorted(reasons.items()))
    assert summary.adapter == "openai"
    info = load_dataset_info(output)
    assert info["counts"] == {"read": summary.read, "accepted": summary.accepted, "quarantined": summary.quarantined,
                              "accepted_by_kind": {"sft": len(expected_good)},
                              "quarantined_by_reason": summary.quarantined_by_reason, "duplicates": 0}
    assert sum(split["samples"] for split in info["splits"].values()) == len(expected_good)
    assert set(info["splits"]) == {"train", "val", "test"}
    assert info["token_lengths"]["count"] == len(expected_good)
    assert info["token_lengths"]["max"] <= MAX_TOKENS
    assert [i["name"] for i in info["inputs"]] == ["part-a.jsonl", "part-b.jsonl"]
    assert info["config"]["max_tokens"] == MAX_TOKENS and info["versions"]["ray"]
    assert sorted(p.name for p in output.parent.iterdir()) == ["dataset"]  # no staging folder left


def test_two_runs_give_identical_shards_and_keys(mixed_input, mixed_run, tmp_path):
    folder, _, _ = mixed_input
    first, _ = mixed_run
    run([folder / "*.jsonl"], tmp_path / "again", max_tokens=MAX_TOKENS, target_shard_rows=4)
    first_shards = sorted(p.relative_to(first) for p in (first / "shards").glob("*.tar"))
    second_shards = sorted(p.relative_to(tmp_path / "again") for p in (tmp_path / "again" / "shards").glob("*.tar"))
    assert first_shards == second_shards and len(first_shards) >= 10
    for rel in first_shards:
        assert (first / rel).read_bytes() == (tmp_path / "again" / rel).read_bytes(), rel
    assert list(read_shards(first)) == list(read_shards(tmp_path / "again"))
    assert (first / "quarantine.jsonl").read_bytes() == (tmp_path / "again" / "quarantine.jsonl").read_bytes()
    assert (first / ".nv-meta/index.uuid").read_text() == (tmp_path / "again" / ".nv-meta/index.uuid").read_text()


def test_the_loader_yields_exactly_the_accepted_conversations(mixed_input, mixed_run, tokenizer):
    from rl_data.energon.sft_dataloader import build_energon_sft_loader
    from rl_data.tokenization.chat import get_formatted_message_log

    _, expected_good, _ = mixed_input
    output, _ = mixed_run
    seen = {}
    for split in ("train", "val", "test"):
        loader = build_energon_sft_loader(
            data_config={"energon": {}, "batch_format": "message_log"}, source={"path": str(output), "split": split}, processor=tokenizer,
            batch_size=3, max_sequence_length=100_000, split_role="validation", logical_rank=0,
            logical_world_size=1, placement_fingerprint="preprocess-test", packing_algorithm=None,
            max_sequences_per_bin=None, sequence_length_pad_multiple=1, only_unmask_final=False,
        )
        for batch in loader:
            for key, message_log in zip(batch["source_ids"], batch["message_log"]):
                assert key not in seen
                seen[key] = [m["token_ids"].tolist() for m in message_log]
    assert set(seen) == set(expected_good)
    for key, sample in expected_good.items():
        expected = [m["token_ids"].tolist() for m in get_formatted_message_log(sample["messages"], tokenizer)]
        assert seen[key] == expected, key


def test_jsonl_json_array_parquet_and_glob_with_detection(ray_session, tmp_path):
    rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = <<{i}+{i}={2 * i}>>{2 * i}\n#### {2 * i}"}
            for i in range(12)]
    data = tmp_path / "in"
    write_jsonl(data / "a.jsonl", rows[:4] + [GSM8K_ROW])
    (data / "b.json").write_text(json.dumps(rows[4:8]))
    pq.write_table(pa.Table.from_pylist(rows[8:]), data / "c.parquet")
    (data / "README.md").write_text("not data")
    summary = run([data / "*.*l", data / "*.json", data / "*.parquet"], tmp_path / "out", target_shard_rows=1)
    assert (summary.adapter, summary.read, summary.accepted, summary.quarantined) == ("prompt_response", 13, 13, 0)
    samples = read_shards(tmp_path / "out")
    assert samples[sample_key("a.jsonl", 4)]["messages"][1]["content"].endswith("\n#### 72")
    assert samples[sample_key("b.json", 0)]["messages"][0]["content"] == "What is 4 + 4?"
    assert samples[sample_key("c.parquet", 3)]["source"] == {"file": "c.parquet", "row": 3}
    assert summary.splits == {"train": 11, "val": 1, "test": 1}


def test_preference_rows_and_a_user_adapter(ray_session, tmp_path):
    pairs = [{"prompt": f"Name color {i}.", "chosen": "Blue.", "rejected": "Blue." if i == 2 else "Seven."}
             for i in range(4)]
    write_jsonl(tmp_path / "pairs.jsonl", pairs)
    summary = run([tmp_path / "pairs.jsonl"], tmp_path / "pref", target_shard_rows=1, splits={"train": 1.0})
    assert (summary.adapter, summary.accepted, summary.quarantined_by_reason) == (
        "preference", 3, {"identical_preference": 1})
    assert read_shards(tmp_path / "pref")[sample_key("pairs.jsonl", 0)] == {
        "kind": "preference", "context": [{"role": "user", "content": "Name color 0."}],
        "chosen": [{"role": "assistant", "content": "Blue."}],
        "rejected": [{"role": "assistant", "content": "Seven."}], "source": {"file": "pairs.jsonl", "row": 0}}

    write_jsonl(tmp_path / "qa.jsonl", [{"q": "a color?", "a": "deep blue"}, {"q": "broken"}])
    summary = run([tmp_path / "qa.jsonl"], tmp_path / "user", adapter="preprocess_fixtures:title_case_adapter",
                  splits={"train": 1.0})
    assert (summary.accepted, summary.quarantined_by_reason) == (1, {"adapter_error": 1})
    assert read_shards(tmp_path / "user")[sample_key("qa.jsonl", 0)]["messages"][1]["content"] == "Deep Blue"
    assert read_quarantine(tmp_path / "user")[0]["message"] == "KeyError: 'a'"


def test_interrupted_run_leaves_no_dataset(ray_session, mixed_input, tmp_path, monkeypatch):
    folder, _, _ = mixed_input
    real_write, calls = dataset_writer.write_tar_shard, []

    def failing_write(path, samples):
        calls.append(path)
        if len(calls) == 3:
            raise OSError("disk full (injected)")
        return real_write(path, samples)

    monkeypatch.setattr(dataset_writer, "write_tar_shard", failing_write)
    with pytest.raises(OSError, match=r"disk full \(injected\)"):
        run([folder / "*.jsonl"], tmp_path / "dataset", target_shard_rows=4)
    assert len(calls) == 3
    assert list(tmp_path.iterdir()) == []


def test_existing_output_is_refused_and_all_rejected_input_fails_cleanly(ray_session, mixed_run, tmp_path):
    output, _ = mixed_run
    with pytest.raises(ConfigError, match="already exists; pass overwrite=True"):
        run([output / "quarantine.jsonl"], output)
    write_jsonl(tmp_path / "bad.jsonl", [{"messages": []}, "nope"])
    with pytest.raises(ValueError, match=r"no row was accepted \(2 read; quarantined invalid_json: 1, missing_field: 1\)"):
        run([tmp_path / "bad.jsonl"], tmp_path / "out", adapter="openai", splits={"train": 1.0})
    assert [p.name for p in tmp_path.iterdir()] == ["bad.jsonl"]


def test_cli_command(ray_session, tmp_path):
    from typer.testing import CliRunner

    from rl_data.cli import app

    write_jsonl(tmp_path / "a.jsonl", [{"instruction": "Say hi.", "output": "Hi!"}] * 3)
    result = CliRunner().invoke(app, ["preprocess", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "out"), "--splits",
                                      "train=1", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert load_dataset_info(tmp_path / "out")["counts"]["accepted_by_kind"] == {"sft": 3}
    bad = CliRunner().invoke(app, ["preprocess", str(tmp_path / "a.jsonl"), "-o", str(tmp_path / "x"), "--splits", "train"])
    assert bad.exit_code == 2 and "expected NAME=RATIO" in bad.output
