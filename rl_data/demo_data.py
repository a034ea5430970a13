"""Raw rows of the main job's tasks (written as JSONL, plus image files).

* ``chat_sft``: the chitchat conversations as OpenAI ``{"messages": [...]}`` rows.

* ``vlm_sft``: synthetic pictures of one coloured shape (circle, square, triangle; red, green,
  blue, yellow) on a white background, saved as PNG files beside the JSONL, with a question about
  the picture and its answer (the colour, the shape or both). Rows reference the files by
  relative path, as real VLM data does, and the preprocessing job turns them into members.
* ``preference``: chitchat conversations as preference pairs: the context is the conversation up
  to an assistant turn, the chosen reply is that turn, the rejected reply is the same turn of the
  next conversation (a fluent reply that does not fit).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

SHAPES = ("circle", "square", "triangle")
COLORS = {"red": (220, 40, 40), "green": (40, 160, 70), "blue": (50, 80, 220), "yellow": (230, 200, 30)}
#: (question, answer template); the answer names the colour, the shape or both.
QUESTIONS = (
    ("What color is the shape in this picture?", "It is {color}."),
    ("Which shape do you see?", "A {shape}."),
    ("Describe the picture in a few words.", "A {color} {shape} on a white background."),
)
#: Picture sizes (pixels); multiples of 28 so the image processor keeps them as they are.
SIZES = ((56, 56), (84, 56), (56, 84), (84, 84))


def shape_picture(shape: str, color: str, size: tuple[int, int], seed: int) -> Any:
    """A PIL image: one ``color`` ``shape`` at a random place and scale on white."""
    from PIL import Image, ImageDraw

    width, height = size
    rng = random.Random(seed)
    side = rng.randint(min(size) // 2, min(size) - 8)
    left, top = rng.randint(2, width - side - 2), rng.randint(2, height - side - 2)
    box = (left, top, left + side, top + side)
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    fill = COLORS[color]
    if shape == "circle":
        draw.ellipse(box, fill=fill)
    elif shape == "square":
        draw.rectangle(box, fill=fill)
    else:
        draw.polygon([(left + side // 2, top), (left, top + side), (left + side, top + side)], fill=fill)
    return image


def shape_question_row(index: int, image_path: str) -> tuple[dict[str, Any], tuple[str, str, tuple[int, int]]]:
    """Row ``index``'s OpenAI-style row referencing ``image_path`` and its (shape, color, size)."""
    shape = SHAPES[index % len(SHAPES)]
    color = list(COLORS)[(index // len(SHAPES)) % len(COLORS)]
    question, answer = QUESTIONS[(index // (len(SHAPES) * len(COLORS))) % len(QUESTIONS)]
    size = SIZES[index % len(SIZES)]
    row = {
        "messages": [
            {"role": "user", "content": [{"type": "image", "image": image_path}, {"type": "text", "text": question}]},
            {"role": "assistant", "content": answer.format(color=color, shape=shape)},
        ]
    }
    return row, (shape, color, size)


def write_shape_question_rows(path: Path, limit: int) -> int:
    """``limit`` picture questions as JSONL at ``path``, images in ``<stem>-images/`` beside it."""
    images = path.parent / f"{path.stem}-images"
    images.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for index in range(limit):
            relative = f"{images.name}/{index:05d}.png"
            row, (shape, color, size) = shape_question_row(index, relative)
            shape_picture(shape, color, size, seed=index).save(path.parent / relative, format="PNG")
            out.write(json.dumps(row) + "\n")
    return limit


def preference_rows(conversations: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """``{"prompt", "chosen", "rejected"}`` rows: reply k of conversation i vs of conversation i+1."""
    usable = [m for m in conversations if len(m) >= 2 and m[0]["role"] == "user" and m[1]["role"] == "assistant"]
    rows = []
    for i, messages in enumerate(usable):
        other = usable[(i + 1) % len(usable)]
        turn = 3 if len(messages) > 3 and len(other) > 3 and messages[3]["role"] == "assistant" else 1
        rows.append({"prompt": messages[:turn], "chosen": messages[turn]["content"], "rejected": other[turn]["content"]})
    return rows


def write_chitchat_preference_rows(path: Path, limit: int) -> int:
    """Up to ``limit`` chitchat preference pairs (see :func:`preference_rows`) as JSONL."""
    from rl_data.sample_data import chitchat_conversations

    rows = preference_rows([c["messages"] for c in chitchat_conversations(limit=limit)])
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
    return len(rows)


def write_chitchat_rows(path: Path, limit: int) -> int:
    """The first ``limit`` chitchat conversations as OpenAI ``{"messages": [...]}`` rows."""
    from rl_data.sample_data import chitchat_conversations

    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with path.open("w", encoding="utf-8") as out:
        for conversation in chitchat_conversations(limit=limit):
            out.write(json.dumps({"messages": conversation["messages"]}, ensure_ascii=False) + "\n")
            written += 1
    return written
