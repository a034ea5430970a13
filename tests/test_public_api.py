"""The public API: the facade (``rl_data``) and the public modules, against the checked-in list.

``tests/data/public_api.txt`` is the list: a name that disappears, a new name, a changed stability
or an internal name re-exported by accident fails here. Change the list on purpose, with a line in
CHANGELOG.md.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import subprocess
import sys
import types
import warnings
from pathlib import Path

import pytest

import rl_data

LIST = Path(__file__).parent / "data" / "public_api.txt"
#: Packages that re-exported names before the facade; each name still resolves, with a FutureWarning.
FORMER_REEXPORTS = (
    "rl_data.distributed",
    "rl_data.jobs",
    "rl_data.packing",
    "rl_data.preprocess",
    "rl_data.prompt_feed",
    "rl_data.tasks",
    "rl_data.tokenization",
)


def checked_in() -> dict[str, str]:
    lines = [line.split() for line in LIST.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {name: stability for name, stability in lines}


def current() -> dict[str, str]:
    names = {f"rl_data.{name}": stability for name, (_, stability) in rl_data._PUBLIC.items()}
    for module, stability in rl_data._PUBLIC_MODULES.items():
        names.update({f"{module}.{name}": stability for name in importlib.import_module(module).__all__})
    return names


def test_the_public_api_is_the_checked_in_list():
    saved, now = checked_in(), current()
    lines = [f"removed: {n}" for n in sorted(saved.keys() - now.keys())]
    lines += [f"added: {n}" for n in sorted(now.keys() - saved.keys())]
    lines += [f"{n}: {saved[n]} -> {now[n]}" for n in sorted(saved.keys() & now.keys()) if saved[n] != now[n]]
    assert not lines, f"the public API differs from {LIST.name} (update it on purpose, with a CHANGELOG line):\n" + "\n".join(lines)


def test_facade_names_resolve_to_their_defining_module():
    assert rl_data.__all__ == sorted(rl_data._PUBLIC)
    for name, (module, _) in rl_data._PUBLIC.items():
        value = getattr(rl_data, name)
        assert value is getattr(importlib.import_module(module), name)
        if inspect.isclass(value) or inspect.isfunction(value):
            assert value.__module__ == module, f"rl_data.{name} is defined in {value.__module__}, listed as {module}"


def test_every_public_name_has_a_docstring():
    missing = []
    for qualified in current():
        module, _, name = qualified.rpartition(".")
        value = getattr(importlib.import_module(module), name)
        if (inspect.isclass(value) or inspect.isfunction(value)) and not inspect.getdoc(value):
            missing.append(qualified)
    assert not missing, f"public names without a docstring: {missing}"


def test_nothing_else_is_reexported_by_the_facade():
    for name in rl_data.__all__:
        getattr(rl_data, name)
    extra = sorted(
        name for name, value in vars(rl_data).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name not in rl_data.__all__
    )  # fmt: skip
    assert extra == [], f"rl_data exposes names outside __all__: {extra}"


@pytest.mark.parametrize("package", FORMER_REEXPORTS)
def test_internal_packages_reexport_nothing(package):
    module = importlib.import_module(package)
    public = sorted(n for n, v in vars(module).items() if not n.startswith("_") and not isinstance(v, types.ModuleType))
    assert public == [], f"{package} re-exports {public}: import them from their modules or from rl_data"


def test_the_type_checking_imports_match_the_facade():
    tree = ast.parse(Path(rl_data.__file__).read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))
    imported = {alias.name: node.module for node in block.body for alias in node.names}
    assert imported == {name: module for name, (module, _) in rl_data._PUBLIC.items()}


def test_importing_the_facade_imports_neither_ray_nor_torch():
    code = "import sys, json, rl_data; print(json.dumps([m for m in ('ray', 'torch', 'transformers') if m in sys.modules]))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == []


def former_reexports() -> list[tuple[str, str]]:
    pairs = []
    for package in FORMER_REEXPORTS:
        init = Path(importlib.import_module(package).__file__)
        tree = ast.parse(init.read_text())
        targets = next(node.value.args[1] for node in tree.body if isinstance(node, ast.Assign))
        pairs += [(package, key.value) for key in targets.keys]
    return pairs


@pytest.mark.parametrize("package,name", former_reexports())
def test_a_former_reexport_still_resolves_with_a_warning_naming_the_new_path(package, name):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(importlib.import_module(package), name)
    assert len(caught) == 1 and caught[0].category is FutureWarning
    message = str(caught[0].message)
    target = message.rsplit("'from ", 1)[1].split(" import ")[0]
    assert f"from {package} import {name}" in message and "rl_data 0.3" in message
    assert getattr(importlib.import_module(target), name) is value
    if target != "rl_data":
        assert name not in rl_data.__all__, f"{name} is public: the warning should name rl_data"
