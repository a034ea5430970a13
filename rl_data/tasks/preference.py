"""``preference``: a shared context with a chosen and a rejected completion (DPO / reward models).

Stored kind ``"preference"``: ``{"kind": "preference", "context": [...], "chosen": [...],
"rejected": [...]}``; pairs are never packed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rl_data.demo_data import write_chitchat_preference_rows
from rl_data.energon.sample_validation import RowRejected, validate_conversation
from rl_data.energon.task_encoders.preference import PreferenceCooker, PreferenceTaskEncoder
from rl_data.task_contract import DemoData, SampleSchema, Task


def _validate(sample: Mapping[str, Any], media: bool) -> None:
    for field in ("context", "chosen", "rejected"):
        if not isinstance(sample.get(field), list) or (field != "context" and not sample[field]):
            raise RowRejected("missing_field", f"preference {field!r} must be a non-empty list of messages")
    for field in ("chosen", "rejected"):
        validate_conversation(sample["context"] + sample[field], where=f"{field}: ", media=media)
        if not any(isinstance(m, Mapping) and m.get("role") == "assistant" for m in sample[field]):
            raise RowRejected("no_assistant_turn", f"{field} has no assistant message")
    if sample["chosen"] == sample["rejected"]:
        raise RowRejected("identical_preference", "chosen and rejected are identical")


TASK = Task(
    name="preference",
    schema=SampleSchema(
        kind="preference",
        message_lists=("context", "chosen", "rejected"),
        validate=_validate,
        conversations=lambda s: [list(s["context"]) + list(s["chosen"]), list(s["context"]) + list(s["rejected"])],
        reasons={"identical_preference": "a preference pair has identical chosen and rejected completions"},
    ),
    encoder_class=PreferenceTaskEncoder,
    cookers={"preference": PreferenceCooker},
    supports_packing=False,
    adapters=("preference",),
    demo=DemoData(
        description="preference pairs from chitchat: the real reply chosen, another conversation's rejected",
        write_raw_rows=write_chitchat_preference_rows,
        adapter="preference",
    ),
)
