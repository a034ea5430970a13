"""Validating a configuration block with pydantic, with errors that name the block, field, value and rule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A configuration refused on the driver, before any actor or Ray task starts.

    ``problems`` lists every problem found, each naming the value, what was expected and the fix.
    The message is ``"<subject>: <problem>"`` for one problem, else ``"<subject>: N problems"``
    followed by one ``"  - <problem>"`` line each.
    """

    def __init__(self, subject: str, problems: list[str]) -> None:
        self.subject, self.problems = subject, list(problems)
        if len(self.problems) == 1:
            super().__init__(f"{subject}: {self.problems[0]}")
        else:
            lines = "\n".join(f"  - {problem}" for problem in self.problems)
            super().__init__(f"{subject}: {len(self.problems)} problems\n{lines}")

    def __reduce__(self) -> tuple[Any, ...]:  # survives pickling (a Ray task's error) with its fields
        return type(self), (self.subject, self.problems)


def validator_error(model: str, problems: list[str]) -> ValueError:
    """What a pydantic validator of ``model`` raises for ``problems``: the one problem as it is
    (pydantic names the model), or a :class:`ConfigError` listing them all."""
    return ValueError(problems[0]) if len(problems) == 1 else ConfigError(model, problems)


def problems_of(error: Any) -> list[str]:
    """Every problem of a pydantic ``ValidationError`` as ``field=value: rule``; a validator's own
    ``ValueError`` as its message alone (a :class:`ConfigError`'s as its problems)."""
    problems: list[str] = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"]) or "<block>"
        if item["type"] == "value_error":  # the project's own checks: their messages name field and value
            cause = item["ctx"]["error"]
            problems.extend(cause.problems if isinstance(cause, ConfigError) else [str(cause)])
        elif item["type"] == "missing":
            problems.append(f"{field}: {item['msg']}")
        else:
            problems.append(f"{field}={item.get('input')!r}: {item['msg']}")
    return problems


def describe_errors(error: Any) -> str:
    """:func:`problems_of` a pydantic ``ValidationError``, joined by ``; ``."""
    return "; ".join(problems_of(error))


def validate_block(model: type[BaseModel], value: Any, *, name: str) -> Any:
    """Validate ``value`` as ``model``; a ``ValueError`` names the block, field, value and rule."""
    if isinstance(value, model):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(
            f"{name} must be a mapping of {model.__name__} fields "
            f"({', '.join(model.model_fields)}), got {type(value).__name__}: {value!r}"
        )
    try:
        return model.model_validate(dict(value))
    except ValidationError as error:
        allowed = ", ".join(model.model_fields)
        raise ValueError(
            f"invalid {name} ({model.__name__}): {describe_errors(error)} "
            f"(allowed fields: {allowed})"
        ) from None
