"""``TrainDemoConfig``: every option of the main job, and the runtime configs it implies."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rl_data.distributed.config import DEFAULT_NAME, DEFAULT_NAMESPACE, LoaderSpec, ParallelLayout, RuntimeConfig
from rl_data.jobs.tasks import sft_demo_task
from rl_data.task_contract import TOKENIZER_FACTORY

#: CPU share of one rank actor (and its placement-group bundle).
RANK_CPUS = 0.5
#: CPU share of one training actor when it runs on the CPU.
TRAINER_CPUS = 0.25


class TrainDemoConfig(BaseModel):
    """Options of ``pipelines/train_sft_demo.py`` (small defaults: ~1-2 minutes on 2 cores)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field("chat_sft", description="a registered task with demo data (see rl_data.jobs.tasks)")
    tokenizer: str = Field("qwen3", description="'qwen3' (built offline) or a local tokenizer folder with a chat template")
    prompt_file: Optional[str] = Field(None, description="TaskDataSpec.prompt_file: '{}' takes the first user turn")
    system_prompt_file: Optional[str] = Field(None, description="TaskDataSpec.system_prompt_file")
    data: Optional[str] = Field(None, description="prepared Energon dataset; preprocessed into if missing")
    work_dir: str = Field("outputs/train_sft_demo", description="raw data, dataset, job config")
    ranks: int = Field(2, ge=1, description="data-parallel ranks (training actors) of run 1")
    logical_shards: Optional[int] = Field(None, ge=1, description="logical data shards G (rank actors); default: ranks")
    resume_ranks: Optional[int] = Field(None, ge=1, description="data-parallel ranks of run 2 (the resumed run); default: ranks")
    mixture: Optional[dict[str, float]] = Field(
        None, description="preprocess the task's data as a weighted mixture of members name -> weight (rows "
        "dealt to the members in turn) and train on it")
    batch_size: int = Field(4, ge=1, description="conversations (or packs) per rank per step")
    seq_len: int = Field(4096, ge=16, description="max sequence length (pack capacity with packing)")
    packing: Optional[str] = Field(None, description="packing algorithm; None: no packing")
    steps: int = Field(6, ge=1, description="steps before the checkpoint")
    resume_steps: int = Field(4, ge=1, description="steps after the checkpoint, run twice and compared")
    checkpoint_dir: Optional[str] = Field(None, description="default: <work_dir>/checkpoint")
    namespace: str = Field(DEFAULT_NAMESPACE, min_length=1)
    coordinator_name: str = Field(DEFAULT_NAME, min_length=1)
    prefetch_depth: int = Field(2, ge=0)
    num_conversations: int = Field(256, ge=8, description="conversations preprocessed into the dataset")
    trainer_gpus: Optional[float] = Field(None, ge=0, description="GPUs per training actor; None: 1 if the cluster has GPUs")
    step_timeout_s: float = Field(300.0, gt=0)
    show_encoding: bool = Field(True, description="print one encoded conversation first")
    progress: bool = True

    @field_validator("task")
    @classmethod
    def _known_task(cls, task: str) -> str:
        sft_demo_task(task)
        return task

    @field_validator("packing")
    @classmethod
    def _known_packing(cls, packing: Optional[str]) -> Optional[str]:
        from rl_data.packing.algorithms import PackingAlgorithm

        if packing is None or packing.lower() in {"", "none", "off"}:
            return None
        names = [a.value for a in PackingAlgorithm]
        if packing.lower() not in names:
            raise ValueError(f"unknown packing algorithm {packing!r}; choose one of {names} or none")
        return packing.lower()

    @model_validator(mode="after")
    def _packing_fits_the_task(self) -> "TrainDemoConfig":
        from rl_data.distributed.shard_map import check_shard_layout

        for dp in (self.ranks, self.dp_of_run(2)):
            check_shard_layout(self.shards, dp)
        if self.mixture is not None and (not self.mixture or any(w <= 0 for w in self.mixture.values())):
            raise ValueError(f"mixture {self.mixture} needs at least one member, every weight > 0")
        task = sft_demo_task(self.task)
        if self.tokenizer != "qwen3" and task.demo.processor_factory != TOKENIZER_FACTORY:
            raise ValueError(
                f"task {self.task!r} builds a multimodal processor around the project tokenizer; "
                f"--tokenizer {self.tokenizer!r} works with text tasks only"
            )
        if self.packing is not None and not task.supports_packing:
            raise ValueError(
                f"task {self.task!r} does not pack sequences (found packing={self.packing!r}); "
                "leave --packing unset (or none) for this task"
            )
        return self

    @field_validator("work_dir", "data", "checkpoint_dir", "prompt_file", "system_prompt_file")
    @classmethod
    def _absolute(cls, path: Optional[str]) -> Optional[str]:
        return None if path is None else str(Path(path).expanduser().absolute())

    @model_validator(mode="before")
    @classmethod
    def _default_checkpoint_dir(cls, values: Any) -> Any:
        if isinstance(values, dict) and values.get("checkpoint_dir") is None:
            work_dir = values.get("work_dir") or cls.model_fields["work_dir"].default
            values = {**values, "checkpoint_dir": str(Path(work_dir) / "checkpoint")}
        return values

    @property
    def shards(self) -> int:
        """Logical data shards G (rank actors)."""
        return self.logical_shards or self.ranks

    def dp_of_run(self, run: int) -> int:
        """DP ranks (training actors) of run 1 or run 2."""
        return self.ranks if run == 1 else (self.resume_ranks or self.ranks)

    @property
    def dataset_path(self) -> str:
        """``--data``, or a dataset in the work dir named after the task and its size (for a
        mixture, the folder's ``mixture.yaml``)."""
        if self.data:
            return self.data
        name = f"dataset-{self.task}-{self.num_conversations}"
        if self.mixture:
            from rl_data.preprocess.mixture import MIXTURE_FILE

            members = "-".join(f"{n}{w:g}" for n, w in self.mixture.items())
            return str(Path(self.work_dir) / f"{name}-mixture-{members}" / MIXTURE_FILE)
        return str(Path(self.work_dir) / name)

    @property
    def is_mixture(self) -> bool:
        return str(self.dataset_path).endswith((".yaml", ".yml"))

    def runtime_config(self, run: int = 1) -> RuntimeConfig:
        """``shards`` rank actors, half a CPU each, in a named coordinator, feeding the DP ranks of ``run``."""
        return RuntimeConfig(
            parallel_layout=ParallelLayout(dp=self.dp_of_run(run)),
            logical_world_size=self.shards,
            prefetch_depth=self.prefetch_depth,
            bundle_resources={"CPU": RANK_CPUS},
            rank_actor_num_cpus=RANK_CPUS,
            namespace=self.namespace,
            name=self.coordinator_name,
            step_timeout_s=self.step_timeout_s,
            control_timeout_s=self.step_timeout_s,
        )

    def loader_spec(self) -> LoaderSpec:
        """The train split of :attr:`dataset_path`, encoded by the task's encoder."""
        task = sft_demo_task(self.task)
        energon: dict = {"shuffle_buffer_size": 64, "max_samples_per_sequence": 16, "task": task.name}
        if self.packing is not None:
            energon["packing_buffer_size"] = 4 * self.batch_size
        data_config: dict[str, Any] = {"energon": energon, "shuffle": True}
        for key in ("prompt_file", "system_prompt_file"):
            if getattr(self, key) is not None:
                data_config[key] = getattr(self, key)  # read here, on the driver: actors get the text
        custom_tokenizer = self.tokenizer != "qwen3"
        # a mixture repeats its members by weight forever: no exact passes
        mode = {"epoch_mode": "virtual"} if self.is_mixture else {}
        return LoaderSpec(
            data_config=data_config,
            source={"path": self.dataset_path, "split": "train", "virtual_epoch_length": 100, **mode},
            batch_size=self.batch_size,
            max_sequence_length=self.seq_len,
            packing_algorithm=self.packing,
            sequence_length_pad_multiple=16 if self.packing else 1,
            processor_factory="rl_data.tokenization.tokenizer:load_tokenizer" if custom_tokenizer else task.demo.processor_factory,
            processor_factory_kwargs={"name_or_path": self.tokenizer} if custom_tokenizer else {},
        )
