"""Every configuration a user can get wrong is refused on the driver, before anything starts.

Each case goes through the entry point a user calls (``LoaderSpec(...)``, ``RuntimeConfig(...)``,
``start_data_coordinator``, ``start_prompt_feed``, ``run_preprocess``, ``build_energon_sft_loader``)
and checks: one exception (``ConfigError``, or pydantic's ``ValidationError`` at model
construction), a message naming the offending value, what was expected and the fix, under a
second (modules imported: the first import of a task or of torch is not the refusal's), and no
placement group or named actor started. Each refusal is listed with its time and the first line
of its message in pytest's terminal summary (``tests/conftest.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from distributed_fixtures import runtime_config
from energon_fixtures import SINGLE_RANK_UNPACKED
from rl_data.config_blocks import ConfigError, problems_of
from rl_data.distributed.config import LoaderSpec, ParallelLayout, RuntimeConfig
from rl_data.distributed.coordinator import start_data_coordinator
from rl_data.energon.config import DataConfig, EnergonLoaderConfig, EnergonSourceConfig, MixtureMember
from rl_data.energon.sft_dataloader import build_energon_sft_loader
from rl_data.preprocess.pipeline import PreprocessConfig, run_preprocess
from rl_data.prompt_feed.feed import FeedConfig, start_prompt_feed
from rl_data.task_registry import get_task

pytestmark = pytest.mark.timeout(120)

#: A refusal on the driver takes less than this (seconds).
LIMIT_S = 1.0
#: Property name under which each test records its refusal for the terminal summary.
REFUSAL = "config_refusal"


@dataclass(frozen=True)
class Refusal:
    """One refusal: the entry point, the call, the exception type and three parts of the message."""

    entry: str
    call: Callable[[Any], Any]
    error: type[Exception]
    value: str
    expected: str
    fix: str


class Context:
    """What the cases are built from: the session's dataset, a tmp folder, the tokenizer."""

    def __init__(self, dataset: Any, tmp_path: Path, tokenizer: Any) -> None:
        self.dataset, self.tmp_path, self.tokenizer = dataset.path, tmp_path, tokenizer

    def spec(self, *, energon: dict | None = None, source: dict | None = None, shuffle: Any = True, **overrides: Any) -> dict:
        """LoaderSpec arguments: the session dataset's train split in loops of 4 batches, changed by the overrides."""
        return dict(
            data_config={"energon": energon or {}, "shuffle": shuffle},
            source={"path": self.dataset, "split": "train", "virtual_epoch_length": 4, **(source or {})},
            batch_size=2,
            max_sequence_length=64,
            **overrides,
        )


    def seed_loader(self, **source: Any) -> Any:
        """``build_energon_sft_loader`` over the session dataset's train split (shuffled unless told)."""
        shuffle = source.pop("shuffle", True)
        return build_energon_sft_loader(
            data_config={"energon": {}, "shuffle": shuffle}, source={"path": self.dataset, "split": "train", **source},
            processor=self.tokenizer, batch_size=2, max_sequence_length=64, split_role="train", **SINGLE_RANK_UNPACKED,
        )

    def preprocess(self, **overrides: Any) -> Any:
        rows = self.tmp_path / "rows.jsonl"
        rows.write_text("".join('{"prompt": "p%d", "response": "r"}\n' % i for i in range(20)))
        arguments = {"inputs": [str(rows)], "output": str(self.tmp_path / "out"), "progress": False, **overrides}
        return run_preprocess(PreprocessConfig(**arguments))


def _config(name: str = "refused") -> RuntimeConfig:
    return runtime_config(2, 1, name=name)


def _no_nv_meta(ctx: Context) -> str:
    (ctx.tmp_path / "shards").mkdir()
    return str(ctx.tmp_path / "shards")


def _metadataset(ctx: Context) -> str:
    path = ctx.tmp_path / "mixture.yaml"
    path.write_text(
        "__module__: megatron.energon\n__class__: MetadatasetV2\nsplits:\n  train:\n    blend:\n"
        f"    - {{weight: 1, path: {ctx.dataset}}}\n    - {{weight: 1, path: gone}}\n"
    )
    return str(path)


MIXTURE = [{"name": "a", "path": "DATASET", "weight": 1.0}, {"name": "b", "path": "DATASET", "weight": 2.0}]


def _mixture(ctx: Context) -> list[dict]:
    return [{**member, "path": ctx.dataset} for member in MIXTURE]


CASES: dict[str, Refusal] = {
    "a missing dataset path": Refusal(
        "start_data_coordinator",
        lambda ctx: start_data_coordinator(_config(), LoaderSpec(**ctx.spec(source={"path": str(ctx.tmp_path / "nope")}))),
        ConfigError, "source path '{tmp}/nope' does not exist", "expected a prepared Energon dataset folder", "rl-data preprocess",
    ),
    "a folder without .nv-meta": Refusal(
        "start_data_coordinator",
        lambda ctx: start_data_coordinator(_config(), LoaderSpec(**ctx.spec(source={"path": _no_nv_meta(ctx)}))),
        ConfigError, "'{tmp}/shards' has no .nv-meta folder", "expected the folder `rl-data preprocess` writes",
        "energon prepare FOLDER",
    ),
    "a split the dataset lacks": Refusal(
        "start_data_coordinator",
        lambda ctx: start_data_coordinator(_config(), LoaderSpec(**ctx.spec(source={"split": "validation"}))),
        ConfigError, "has no split 'validation'", "its splits are ['test', 'train', 'val']", "set the source's split",
    ),
    "a metadataset member that does not exist": Refusal(
        "start_data_coordinator",
        lambda ctx: start_data_coordinator(
            _config(), LoaderSpec(**ctx.spec(source={"path": _metadataset(ctx), "epoch_mode": "virtual"}))
        ),
        ConfigError, "member '{tmp}/gone' does not exist", "expected a prepared Energon dataset folder", "check the path",
    ),
    "a processor factory that cannot be found": Refusal(
        "start_data_coordinator",
        lambda ctx: start_data_coordinator(_config(), LoaderSpec(**ctx.spec(processor_factory="no_such_pkg.tok:load"))),
        ConfigError, "module 'no_such_pkg.tok' cannot be found", "expected an installed module", "check the spelling",
    ),
    "bundle indices without a placement group": Refusal(
        "start_data_coordinator",
        lambda ctx: start_data_coordinator(_config(), LoaderSpec(**ctx.spec()), bundle_of_rank=[0, 1]),
        ConfigError, "bundle_of_rank is [0, 1] but placement_group is None", "expected both or neither",
        "pass that group as placement_group",
    ),
    "every problem at once": Refusal(
        "start_data_coordinator",
        lambda ctx: start_data_coordinator(
            _config(), LoaderSpec(**ctx.spec(source={"split": "dev"}, processor_factory="no_such_pkg.tok:load"))
        ),
        ConfigError, "2 problems", "has no split 'dev'", "module 'no_such_pkg.tok' cannot be found",
    ),
    "a train loader without shuffle": Refusal(
        "LoaderSpec", lambda ctx: LoaderSpec(**ctx.spec(shuffle=False)),
        ValidationError, "data_config['shuffle'] is False", "expected True", "set data_config['shuffle'] = True",
    ),
    "a mixture with exact epochs": Refusal(
        "LoaderSpec",
        lambda ctx: LoaderSpec(**ctx.spec(source={"path": None, "mixture": _mixture(ctx), "virtual_epoch_length": 0})),
        ValidationError, "train source 'mixture(a=1, b=2)' has epoch_mode 'exact'", "so it has no exact passes",
        "set source epoch_mode 'virtual'",
    ),
    "virtual epochs without a length": Refusal(
        "LoaderSpec", lambda ctx: LoaderSpec(**ctx.spec(source={"epoch_mode": "virtual", "virtual_epoch_length": 0})),
        ValidationError, "virtual_epoch_length 0", "expected a length > 0", "set virtual_epoch_length",
    ),
    "a cooker the task lacks": Refusal(
        "LoaderSpec", lambda ctx: LoaderSpec(**ctx.spec(energon={"cooker": "raw"})),
        ValidationError, "data_config['energon']['cooker'] is 'raw'", "has no such cooker", "set one of ['chat']",
    ),
    "a task that cannot pack": Refusal(
        "LoaderSpec",
        lambda ctx: LoaderSpec(**ctx.spec(energon={"task": "preference", "packing_buffer_size": 8},
                                          packing_algorithm="first_fit_decreasing")),  # fmt: skip
        ValidationError, "task 'preference' does not pack its samples", "packing_algorithm is 'first_fit_decreasing'",
        "remove packing_algorithm",
    ),
    "a DP size that does not divide G": Refusal(
        "RuntimeConfig", lambda ctx: RuntimeConfig(parallel_layout=ParallelLayout(dp=3), logical_world_size=4),
        ValidationError, "parallel_layout.dp=3 does not divide the 4 logical data shards", "dp may be one of [1, 2, 4]",
        "choose a logical_world_size",
    ),
    "a prompt feed over a task that is not prompts": Refusal(
        "start_prompt_feed",
        lambda ctx: start_prompt_feed(
            _config("refused_feed"), LoaderSpec(**ctx.spec(source={"virtual_epoch_length": 0})), FeedConfig(max_outstanding=8)
        ),
        ConfigError, "data_config['energon']['task'] is 'chat_sft'", "expected 'rl_prompt'", "set it to 'rl_prompt'",
    ),
    "a prompt feed over a validation split": Refusal(
        "start_prompt_feed",
        lambda ctx: start_prompt_feed(
            _config("refused_feed"),
            LoaderSpec(**ctx.spec(energon={"task": "rl_prompt"}, source={"split": "val", "virtual_epoch_length": 0},
                                  split_role="validation")),  # fmt: skip
            FeedConfig(max_outstanding=8),
        ),
        ConfigError, "split_role is 'validation'", "expected 'train'", "set split_role 'train'",
    ),
    "preprocess: a missing input": Refusal(
        "run_preprocess", lambda ctx: ctx.preprocess(inputs=[str(ctx.tmp_path / "nope.jsonl")]),
        ConfigError, "input '{tmp}/nope.jsonl'", "matches no file", "check the path or glob",
    ),
    "preprocess: an existing output": Refusal(
        "run_preprocess", lambda ctx: ctx.preprocess(output=ctx.dataset),
        ConfigError, "output {dataset} already exists", "already exists", "pass overwrite=True (--overwrite)",
    ),
    "preprocess: an unknown task": Refusal(
        "run_preprocess", lambda ctx: ctx.preprocess(task="qa_pairs"),
        ConfigError, "unknown task 'qa_pairs'", "registered tasks are [", "give an import path",
    ),
    "preprocess: a tokenizer folder that does not exist": Refusal(
        "run_preprocess", lambda ctx: ctx.preprocess(tokenizer=str(ctx.tmp_path / "tok")),
        ConfigError, "tokenizer '{tmp}/tok'", "neither 'qwen3' nor a local folder", "pass a folder holding tokenizer.json",
    ),
    "seed API: a missing dataset path": Refusal(
        "build_energon_sft_loader", lambda ctx: ctx.seed_loader(path=str(ctx.tmp_path / "nope")),
        ConfigError, "source path '{tmp}/nope' does not exist", "expected a prepared Energon dataset folder",
        "energon prepare FOLDER",
    ),
    "seed API: a train loader without shuffle": Refusal(
        "build_energon_sft_loader", lambda ctx: ctx.seed_loader(shuffle=False),
        ConfigError, "data_config['shuffle'] is False", "expected True", "set data_config['shuffle'] = True",
    ),
}


@pytest.fixture(scope="module", autouse=True)
def _modules_imported():
    """What the checks import on their first call, imported once (the tasks the cases name; pandas,
    which pyarrow imports when preprocess first reads rows): a refusal's time is the check's."""
    import pandas  # noqa: F401

    for name in ("chat_sft", "preference", "rl_prompt"):
        get_task(name)


def _started(ray: Any) -> tuple[set[str], set[tuple[str, str]]]:
    """The live placement groups and the named actors of the cluster."""
    groups = {pg_id for pg_id, info in ray.util.placement_group_table().items() if info["state"] != "REMOVED"}
    actors = {(a["namespace"], a["name"]) for a in ray.util.list_named_actors(all_namespaces=True)}
    return groups, actors


def _first_line(error: BaseException) -> str:
    """The refusal's first line: for a pydantic error, its first problem (its own first line names only the model)."""
    return problems_of(error)[0] if isinstance(error, ValidationError) else str(error).splitlines()[0]


@pytest.mark.parametrize("case", list(CASES))
def test_the_refusal_comes_on_the_driver_at_once_naming_value_expected_and_fix(
    case, ray_session, energon_dataset, tokenizer, tmp_path, record_property
):
    refusal, ctx = CASES[case], Context(energon_dataset, tmp_path, tokenizer)
    before = _started(ray_session)
    started = time.monotonic()
    with pytest.raises(ValueError) as caught:
        refusal.call(ctx)
    seconds = time.monotonic() - started
    error = caught.value
    assert type(error) is refusal.error, repr(error)
    message = str(error)
    for part in (refusal.value, refusal.expected, refusal.fix):
        part = part.format(tmp=tmp_path, dataset=energon_dataset.path)
        assert part in message, f"{part!r} not in {message!r}"
    assert seconds < LIMIT_S, f"{case}: refused after {seconds:.2f} s"
    assert _started(ray_session) == before, "something started before the refusal"
    record_property(REFUSAL, {"case": case, "entry": refusal.entry, "seconds": seconds, "message": _first_line(error)})


@pytest.mark.parametrize(
    "model",
    [RuntimeConfig, ParallelLayout, LoaderSpec, DataConfig, EnergonLoaderConfig, EnergonSourceConfig, MixtureMember,
     FeedConfig, PreprocessConfig],  # fmt: skip
)
def test_every_config_field_has_a_description(model: type[BaseModel]):
    missing = [name for name, field in model.model_fields.items() if not (field.description or "").strip()]
    assert missing == [], f"{model.__name__} fields without a description (the docs' config tables need one): {missing}"


def test_a_driver_that_cannot_see_the_datasets_skips_only_their_checks(energon_dataset, tmp_path, tokenizer):
    """``check_datasets=False`` (a head node without the shared mount): the datasets are left to the
    ranks, every other check still runs on the driver."""
    from rl_data.distributed.config import start_problems

    ctx = Context(energon_dataset, tmp_path, tokenizer)
    missing = LoaderSpec(**ctx.spec(source={"path": str(tmp_path / "only_on_the_workers")}))
    assert start_problems(_config(), missing, check_datasets=False) == []
    assert any("only_on_the_workers' does not exist" in p for p in start_problems(_config(), missing))
    problems = start_problems(_config(), missing, bundle_of_rank=[0, 1], check_datasets=False)
    assert len(problems) == 1 and "bundle_of_rank is [0, 1] but placement_group is None" in problems[0]
