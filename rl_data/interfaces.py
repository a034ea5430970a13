"""Data contracts shared by every task: message logs, datum specs, task specs, processing callables.

Mirrors ``nemo_rl.data.interfaces``. ``TokenizerType`` (transformers'
``PreTrainedTokenizerBase``) is resolved lazily so importing this module does not import
transformers.
"""

import dataclasses
import os
from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Union

import torch
from typing_extensions import NotRequired, TypedDict

from rl_data.packed_tensor import PackedTensor

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as TokenizerType

#: OpenAI-style message log; each message may also carry tensors (e.g. ``token_ids``).
LLMMessageLogType = list[dict[str, str | torch.Tensor]]
#: Same, with per-message media (e.g. ``pixel_values``) as PackedTensor.
VLMMessageLogType = list[dict[str, str | torch.Tensor | PackedTensor]]
#: A whole conversation flattened to key -> concatenated tensor (or list of strings).
FlatMessagesType = dict[str, list[str] | torch.Tensor]
#: A filesystem path: a string or an ``os.PathLike``.
PathLike = Union[str, "os.PathLike[Any]"]

__all__ = [
    "DatumSpec",
    "FlatMessagesType",
    "LLMMessageLogType",
    "NemoGymSourceIdentity",
    "PathLike",
    "PreferenceDatumSpec",
    "TaskDataPreProcessFnCallable",
    "TaskDataProcessFnCallable",
    "TaskDataSpec",
    "TokenizerType",
    "VLMMessageLogType",
]


def __getattr__(name: str) -> Any:
    if name == "TokenizerType":
        from transformers import PreTrainedTokenizerBase

        globals()[name] = PreTrainedTokenizerBase  # later lookups (and get_type_hints) see it
        return PreTrainedTokenizerBase
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class NemoGymSourceIdentity:
    """Filesystem identity used to cache agent names from one Gym dataset.

    Two snapshots match when device, inode, ctime, mtime and size are all equal: an in-place
    rewrite (even to the same size) changes ctime/mtime, ``os.replace`` changes the inode,
    and ``touch`` changes both times.
    """

    path: str
    device: int
    inode: int
    ctime_ns: int
    mtime_ns: int
    size: int

    @classmethod
    def from_stat(cls, path: str, stat: os.stat_result) -> "NemoGymSourceIdentity":
        """Build a source identity snapshot from a resolved path and stat result."""
        return cls(
            path=os.fspath(path),
            device=stat.st_dev,
            inode=stat.st_ino,
            ctime_ns=stat.st_ctime_ns,
            mtime_ns=stat.st_mtime_ns,
            size=stat.st_size,
        )

    def matches(self, stat: os.stat_result) -> bool:
        """Return whether stat still describes the same source contents."""
        return (
            self.device == stat.st_dev
            and self.inode == stat.st_ino
            and self.ctime_ns == stat.st_ctime_ns
            and self.mtime_ns == stat.st_mtime_ns
            and self.size == stat.st_size
        )


class DatumSpec(TypedDict):
    """One sample as a task yields it: its message log, token count and environment info (an RL
    prompt's ground truth), with its loss multiplier and index."""

    message_log: LLMMessageLogType | VLMMessageLogType
    length: int  # total number of tokens over all messages
    extra_env_info: dict[str, Any] | None
    loss_multiplier: float  # 0.0 masks the datum out of the loss
    idx: int
    task_name: NotRequired[str]
    message_loss_mask: NotRequired[list[int]]
    tools: NotRequired[list[dict[str, Any]]]
    stop_strings: NotRequired[list[str]]
    __extra__: NotRequired[Any]  # room for task-specific fields


class PreferenceDatumSpec(TypedDict):
    """One preference pair: the chosen and the rejected message logs of the same context, with
    their token counts."""

    message_log_chosen: LLMMessageLogType | VLMMessageLogType
    message_log_rejected: LLMMessageLogType | VLMMessageLogType
    length_chosen: int
    length_rejected: int
    loss_multiplier: float
    idx: int
    task_name: NotRequired[str]


@dataclass
class TaskDataSpec:
    """Per-task data settings; ``prompt``/``system_prompt`` are read from their files on creation.

    Every setting defaults to None, meaning "not set here": ``copy_defaults`` fills those
    from another spec.
    """

    task_name: str | None = None
    prompt_file: PathLike | None = None
    system_prompt_file: PathLike | None = None
    num_frames: int | None = None
    video_sampling_style: str | None = None
    video_target_num_patches: int | None = None
    video_temporal_patch_size: int | None = None
    video_maintain_aspect_ratio: bool | None = None
    pad_audio_to_hop_length: bool | None = None
    min_generation_tokens: int | None = None
    image_max_num_tiles: int | None = None
    prompt: str | None = dataclasses.field(default=None, init=False)
    system_prompt: str | None = dataclasses.field(default=None, init=False)

    def __post_init__(self) -> None:
        self.prompt = _read_prompt_file("prompt_file", self.prompt_file)
        self.system_prompt = _read_prompt_file("system_prompt_file", self.system_prompt_file)

    def copy_defaults(self, from_spec: "TaskDataSpec") -> None:
        """Apply default values from another Task instance for any None attributes."""
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is None:
                setattr(self, f.name, getattr(from_spec, f.name))


def _read_prompt_file(field_name: str, path: PathLike | None) -> str | None:
    if path is None:
        return None
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"TaskDataSpec.{field_name}: no file at {os.fspath(path)!r} "
            f"(absolute: {os.path.abspath(path)!r}); point {field_name} at an existing UTF-8 "
            "text file or leave it None"
        )
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(
            f"TaskDataSpec.{field_name}: {os.fspath(path)!r} is not valid UTF-8 ({e}); "
            "save the prompt file as UTF-8"
        ) from e


class TaskDataProcessFnCallable(Protocol):
    """A callable that processes a loaded datum dictionary into a DatumSpec."""

    @abstractmethod
    def __call__(
        self,
        datum_dict: dict[str, Any],
        task_data_spec: TaskDataSpec,
        tokenizer: "TokenizerType",
        max_seq_length: int | None,
        idx: int,
    ) -> DatumSpec: ...


class TaskDataPreProcessFnCallable(Protocol):
    """A callable that processes a loaded raw datum dictionary into a dictionary with required format for further processing."""  # noqa: E501

    @abstractmethod
    def __call__(self, datum_dict: dict[str, Any]) -> dict[str, Any]: ...
