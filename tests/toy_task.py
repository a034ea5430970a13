"""A toy task added in one module: the proof that a task is one module (see test_tasks.py).

``toy_qa`` stores ``{"kind": "toy_qa", "question": str, "answer": str}``; its adapter reads
``{"q", "a"}`` rows (a row whose answer is not a number is quarantined as ``non_numeric``); its
encoder renders the pair as a user/assistant turn through the chat template and batches the
SFT way, plus a ``question_chars`` column; its config has one option, ``shout`` (upper-case
the question). Nothing outside this module mentions it: it is named by import path,
``"toy_task:TASK"``.
"""

from __future__ import annotations

from typing import Any

from megatron.energon import Sample, basic_sample_keys, edataclass, stateless

from rl_data.energon.sample_validation import RowRejected
from rl_data.energon.task_encoders.base import BaseSFTTaskEncoder, EncodedSFTSample
from rl_data.energon.task_encoders.cookers import decode_record
from rl_data.task_contract import AdapterSpec, SampleSchema, Task, TaskConfig


def toy_adapter(row: dict[str, Any]) -> dict[str, Any]:
    """``{"q", "a"}`` -> a ``toy_qa`` sample."""
    return {"kind": "toy_qa", "question": str(row["q"]), "answer": str(row["a"])}


def _validate(sample: Any, media: bool) -> None:
    if not sample["answer"].strip().lstrip("-").isdigit():
        raise RowRejected("non_numeric", f"answer {sample['answer']!r} is not a whole number")


def _messages(question: str, answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]


@edataclass
class ToySample(Sample):
    question: str
    answer: str


class ToyCooker:
    COMPONENT_VERSION = 1

    @staticmethod
    @stateless
    def cook(raw: dict[str, Any]) -> ToySample:
        _, record = decode_record(raw, "toy_qa", reader="the toy cooker")
        return ToySample(**basic_sample_keys(raw), question=record["question"], answer=record["answer"])


class ToyConfig(TaskConfig):
    shout: bool = False


class ToyEncoder(BaseSFTTaskEncoder):
    COMPONENT_VERSION = 1
    DEFAULT_COOKER = ToyCooker

    def __init__(self, *, shout: bool, **options: Any) -> None:
        super().__init__(**options)
        self.shout = shout

    @stateless
    def encode_sample(self, sample: ToySample) -> EncodedSFTSample:
        question = sample.question.upper() if self.shout else sample.question
        return self.finish_encoding(sample, self.adapter.format(_messages(question, sample.answer)))


TASK = Task(
    name="toy_qa",
    schema=SampleSchema(
        kind="toy_qa",
        message_lists=(),
        validate=_validate,
        conversations=lambda s: [_messages(s["question"], s["answer"])],
        reasons={"non_numeric": "the answer is not a whole number"},
    ),
    encoder_class=ToyEncoder,
    cookers={"toy": ToyCooker},
    config_class=ToyConfig,
    supports_packing=False,
    adapters=("toy_qa",),
    adapter_specs=(AdapterSpec.of(toy_adapter, ["q", "a"], name="toy_qa"),),
)
