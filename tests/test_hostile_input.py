"""Hostile and messy input: no single row ends the job, every bad row gets the reason that names
its real problem, BOM and invalid UTF-8, splits of small inputs, duplicates, the failed-rows
budget, and errors reported on one line before Ray starts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from preprocess_fixtures import hostile_rows, read_quarantine, read_shards, write_jsonl

from rl_data.energon.dataset_writer import SplitAssigner, min_samples_for_splits
from rl_data.preprocess.pipeline import PreprocessConfig, run_preprocess
from rl_data.preprocess.adapters import openai_messages, resolve_adapter, sharegpt
from rl_data.preprocess.pipeline import check_job, load_dataset_info
from rl_data.preprocess.readers import resolve_inputs, stream_file_rows
from rl_data.preprocess.transform import transform_batch
from rl_data.preprocess.validation import RowRejected, parse_row, validate_sample
from rl_data.preprocess.writer import FailedRowsBudgetExceeded

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parents[1]


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def transform(raws: list[str], adapter=openai_messages, utf8_errors=None) -> list[dict]:
    batch = pa.table({"file": ["a.jsonl"] * len(raws), "row": list(range(len(raws))), "raw": raws,
                      "utf8_error": utf8_errors or [""] * len(raws)})
    return transform_batch(batch, adapter=adapter, tokenizer="qwen3", max_tokens=None, raw_chars=200,
                           folders={"a.jsonl": "."}).to_pylist()


# -- item 9: any exception while transforming a row quarantines that row -----------------------


def test_a_lone_surrogate_is_quarantined_not_a_tokenizer_type_error(tokenizer):
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})
    bad = good.replace('"hi"', '"x \\ud800 y"')
    out = transform([bad, good, good.replace('"hi"', '"\\ud83d\\ude00 pair"')])
    assert [(r["accepted"], r["reason"]) for r in out] == [(False, "invalid_unicode"), (True, ""), (True, "")]
    assert out[0]["message"].startswith("row.messages[0].content: lone UTF-16 surrogate U+D800 at character 2")


def test_a_100000_deep_array_is_invalid_json_in_tasks_and_in_adapter_detection(tmp_path):
    deep = '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(RowRejected, match="nested too deeply") as error:
        parse_row(deep)
    assert error.value.reason == "invalid_json"
    assert [r["reason"] for r in transform([deep])] == ["invalid_json"]
    path = write_jsonl(tmp_path / "a.jsonl", [deep] + [{"prompt": f"p{i}", "response": "r"} for i in range(7)])
    config = PreprocessConfig(inputs=[str(path)], output=str(tmp_path / "out"))
    assert check_job(config)[1] == "prompt_response"  # detection on the driver survives the row


def test_an_unexpected_exception_is_a_transform_error_naming_it():
    adapter = resolve_adapter("preprocess_fixtures:unserializable_tools_adapter")
    out = transform([json.dumps({"q": "q?", "a": "a."})], adapter=adapter)
    assert (out[0]["accepted"], out[0]["reason"]) == (False, "transform_error")
    assert out[0]["message"] == "TypeError: Object of type set is not JSON serializable"


# -- items 10, 11: invalid UTF-8 and the BOM ----------------------------------------------------


def test_invalid_utf8_is_flagged_with_its_byte_offset_and_a_bom_is_dropped(tmp_path):
    lines = [b"\xef\xbb\xbf" + b'{"a": 1}', b'{"b": "x \xff\xfe y"}', b'{"c": 3}']
    path = write_lines(tmp_path / "a.jsonl", lines)
    rows = [t.to_pylist() for t in stream_file_rows(resolve_inputs([str(path)])[0])][0]
    assert [(r["row"], r["raw"]) for r in rows] == [(0, '{"a": 1}'), (1, '{"b": "x \ufffd\ufffd y"}'), (2, '{"c": 3}')]
    offset = len(lines[0]) + 1 + lines[1].index(b"\xff")
    assert rows[1]["utf8_error"] == (f"invalid UTF-8 byte 0xff at byte offset {offset} of the file (byte 9 of line 2); "
                                     "re-encode the file as UTF-8 or fix the line")
    assert rows[0]["utf8_error"] == rows[2]["utf8_error"] == ""
    out = transform([r["raw"] for r in rows], utf8_errors=[r["utf8_error"] for r in rows])
    assert out[1]["reason"] == "invalid_utf8" and f"byte offset {offset}" in out[1]["message"]


def test_json_array_files_with_a_bom_or_invalid_utf8(tmp_path):
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps([{"a": 1}, {"b": 2}]).encode())
    (tmp_path / "bad.json").write_bytes(b'[{"a": "ok"}, {"b": "\xff"}, {"c": "\\ud800"}]')
    bom, bad = resolve_inputs([str(tmp_path / "bom.json"), str(tmp_path / "bad.json")])[::-1]
    assert [r["raw"] for t in stream_file_rows(bom) for r in t.to_pylist()] == ['{"a": 1}', '{"b": 2}']
    rows = [r for t in stream_file_rows(bad) for r in t.to_pylist()]
    assert [(r["raw"], bool(r["utf8_error"])) for r in rows] == [
        ('{"a": "ok"}', False), ('{"b": "\ufffd"}', True), ('{"c": "\\ud800"}', False)]
    offset = (tmp_path / "bad.json").read_bytes().index(b"\xff")
    assert f"first invalid byte 0xff is at byte offset {offset})" in rows[1]["utf8_error"]


# -- item 15: reasons that name the real problem; ShareGPT speakers ------------------------------


def test_reasons_name_the_real_problem():
    def rejected(*messages):
        with pytest.raises(RowRejected) as error:
            validate_sample({"kind": "sft", "messages": list(messages)})
        return error.value.reason, error.value.message

    answer = {"role": "assistant", "content": "ok"}
    assert rejected({"role": "user"}, answer) == (
        "missing_field", "message 0 (user): 'content' is missing; expected text or content parts")
    assert rejected({"role": "user", "content": None}, answer)[0] == "missing_field"
    assert rejected("hello", answer) == (
        "invalid_message", "message 0 is a str ('hello'); expected a dict with 'role' and 'content'")


@pytest.mark.parametrize("speaker", ["bing", "bard", "chatgpt", "gpt"])
def test_sharegpt_bot_speakers_are_assistant_turns(speaker):
    sample = sharegpt({"conversations": [{"from": "human", "value": "hi"}, {"from": speaker, "value": "hello"}]})
    assert sample["messages"][1] == {"role": "assistant", "content": "hello"}


# -- item 12: splits of small inputs ----------------------------------------------------------


def test_splits_are_assigned_per_sample_following_the_ratios():
    assigner = SplitAssigner({"train": 0.8, "val": 0.1, "test": 0.1})
    names = [assigner.next() for _ in range(1000)]
    assert {n: names.count(n) for n in ("train", "val", "test")} == {"train": 800, "val": 100, "test": 100}
    assert min_samples_for_splits({"train": 0.8, "val": 0.1, "test": 0.1}) == 7
    assert set(names[:7]) == {"train", "val", "test"}
    assert min_samples_for_splits({"train": 1.0}) == 1


def test_too_few_rows_for_the_splits_are_refused_before_any_work(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"p{i}", "response": "r"} for i in range(5)])
    with pytest.raises(ValueError, match=r"the input has only 5 row\(s\), too few for splits .* at least 7 rows; "
                                         r"add rows or choose fewer splits \(e.g. --splits train=1\)"):
        check_job(PreprocessConfig(inputs=[str(path)], output=str(tmp_path / "out")))
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(ValueError, match=r"input .*empty.jsonl is empty: no row to preprocess"):
        check_job(PreprocessConfig(inputs=[str(tmp_path / "empty.jsonl")], output=str(tmp_path / "out")))


# -- the job on real Ray -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_run(ray_session, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    rows = hostile_rows()
    write_lines(folder / "chat.jsonl", [raw for raw, _ in rows])
    output = folder / "dataset"
    summary = run_preprocess(PreprocessConfig(inputs=[str(folder / "chat.jsonl")], output=str(output), progress=False))
    return rows, output, summary


def test_the_job_quarantines_every_hostile_row_and_keeps_the_rest(hostile_run):
    rows, output, summary = hostile_run
    expected_bad = {index: reason for index, (_, reason) in enumerate(rows) if reason}
    assert {q["row"]: q["reason"] for q in read_quarantine(output)} == expected_bad
    accepted = [index for index, (_, reason) in enumerate(rows) if not reason]
    assert sorted(s["source"]["row"] for s in read_shards(output).values()) == accepted
    assert summary.quarantined_by_reason == {reason: 1 for reason in sorted(expected_bad.values())}
    info = load_dataset_info(output)
    assert info["counts"]["quarantined_by_reason"] == summary.quarantined_by_reason
    # the default 64 MB shards and 80/10/10 splits work on 15 accepted rows: one shard per split
    assert {name: split["samples"] for name, split in info["splits"].items()} == {"train": 12, "val": 2, "test": 1}
    assert sorted(s["path"] for s in info["shards"]) == [
        "shards/test-000000.tar", "shards/train-000000.tar", "shards/val-000000.tar"]
    # the repeated row is kept and counted
    assert info["counts"]["duplicates"] == summary.duplicates == 1
    assert info["duplicates"].startswith("kept")


def test_the_loader_reads_every_split_of_a_small_dataset(hostile_run, tokenizer):
    from energon_fixtures import SINGLE_RANK_UNPACKED

    from rl_data.energon.sft_dataloader import build_energon_sft_loader

    _, output, summary = hostile_run
    seen = 0
    for split in ("train", "val", "test"):
        loader = build_energon_sft_loader(
            data_config={"energon": {}}, source={"path": str(output), "split": split}, processor=tokenizer,
            batch_size=1, max_sequence_length=100_000, split_role="validation", **SINGLE_RANK_UNPACKED)
        seen += sum(len(batch["source_ids"]) for batch in loader)
        loader.close()
    assert seen == summary.accepted == 15


def test_the_failed_rows_budget_stops_the_job_and_leaves_no_output(ray_session, tmp_path):
    rows = [{"prompt": f"p{i}", "response": "r"} for i in range(20)] + ["not json"] * 4
    write_jsonl(tmp_path / "a.jsonl", rows)
    with pytest.raises(FailedRowsBudgetExceeded, match=(
            r"4 of the first 24 rows failed \(invalid_json: 4\), more than the budget of 3 \(max of --max-failed-rows "
            r"3 and --max-failed-fraction 0.01 of the rows read\); first: a.jsonl row 20: invalid_json: ")):
        run_preprocess(PreprocessConfig(inputs=[str(tmp_path / "a.jsonl")], output=str(tmp_path / "out"),
                                        progress=False, max_failed_rows=3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl"]
    summary = run_preprocess(PreprocessConfig(inputs=[str(tmp_path / "a.jsonl")], output=str(tmp_path / "ok"),
                                              progress=False, max_failed_rows=4))
    assert summary.quarantined_by_reason == {"invalid_json": 4}


# -- item 15: errors before Ray, on one line ---------------------------------------------------


def run_cli(*args: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    environment = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | (env or {})
    start = time.monotonic()
    result = subprocess.run([sys.executable, str(REPO / "pipelines" / "preprocess.py"), *args], capture_output=True,
                            text=True, timeout=180, env=environment, cwd=REPO)
    return result, time.monotonic() - start


@pytest.mark.parametrize("case", ["missing", "empty", "existing"])
def test_input_and_output_errors_are_one_line_before_ray_starts(tmp_path, case):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    write_jsonl(tmp_path / "ok.jsonl", [{"prompt": "p", "response": "r"}] * 8)
    (tmp_path / "out").mkdir()
    inputs, output = {"missing": ("nope.jsonl", "new"), "empty": ("empty.jsonl", "new"), "existing": ("ok.jsonl", "out")}[case]
    result, seconds = run_cli(str(tmp_path / inputs), "-o", str(tmp_path / output), "--no-progress")
    expected = {"missing": "ConfigError: input '.*nope.jsonl' matches no file; check the path or glob",
                "empty": r"ConfigError: input .*empty.jsonl is empty: no row to preprocess",
                "existing": r"ConfigError: output .*out already exists; pass overwrite=True \(--overwrite\)"}[case]
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines() + result.stdout.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[1] == "(run again with --debug for the full traceback)"
    assert re.match("preprocess failed: " + expected, lines[0]), lines[0]
    assert "Ray" not in result.stderr and seconds < 30


def test_debug_shows_the_full_traceback(tmp_path):
    result, _ = run_cli(str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "out"), "--debug")
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "preprocess failed" not in result.stderr


@pytest.mark.timeout(300)
def test_an_error_inside_a_ray_task_is_one_line(tmp_path, ray_session):
    import ray

    write_jsonl(tmp_path / "a.jsonl", [{"prompt": f"p{i}", "response": "r"} for i in range(120)])
    (tmp_path / "z.json").write_text('[{"prompt": "p", "response": "r"}, {"bad": ')
    args = [str(tmp_path / "a.jsonl"), str(tmp_path / "z.json"), "-o", str(tmp_path / "out"), "--no-progress",
            "--ray-address", ray.get_runtime_context().gcs_address]
    result, _ = run_cli(*args)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if "Traceback" in line or "open an issue" in line]
    assert errors == [] and len(result.stderr.splitlines()) < 12, result.stderr
    assert (f"preprocess failed: ValueError: {tmp_path / 'z.json'} looks like a JSON array but does not parse "
            "(Expecting value: line 1 column 44 (char 43)); fix the file or convert it to JSON lines (one object per "
            "line)\n(run again with --debug for the full traceback)") in result.stderr
    assert not (tmp_path / "out").exists()
