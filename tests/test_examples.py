"""Every program in the repository's user pages runs as pasted: ``examples/*.py`` and every ```python
fence in README.md and docs/ (programs equal but for comments and their docstring run once).

Each runs as a user runs it: ``python program.py`` in an empty folder, with the user's environment
(``RAY_AUTH_MODE`` and the rest kept) but no ``RAY_ADDRESS`` and none of the test session's
``PYTHONPATH``, so the program starts a Ray of its own. ``ray.init()`` without an address connects
to the cluster named in ``$RAY_TMPDIR/ray/ray_current_cluster`` (written by ``ray start``) when
there is one: every program gets a fresh ``RAY_TMPDIR`` (below ``ray_head.TEST_RAY_ROOT``), so it
never joins the test session's Ray or another cluster on the machine. Its output must not show it
joining an existing cluster, and a Ray it started must keep its session below that ``RAY_TMPDIR``.
Its temporary work folders go to a ``TMPDIR`` of the test's own. A program that exits non-zero, times out or prints other than
expected fails; the fences of README.md and docs/ must also compile (checked in the default run).

Only ``examples/sft_quickstart.py`` runs by default; the rest are marked ``slow`` (CI runs them).
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from ray_head import private_ray_dir

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
#: The program the default test run keeps (the README's first quickstart).
DEFAULT_RUN = "examples/sft_quickstart.py"
#: Seconds a program may run (a Ray start, rank actors, Ray Train's worker group on a loaded machine).
PROGRAM_TIMEOUT_S = 600
#: A fence that opens a Python program in Markdown: ```python (or ```py, ~~~python).
_FENCE_OPEN = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(python|py|python3)\s*$")
#: Ray's log lines when ``ray.init()`` starts a cluster / joins an existing one.
STARTED_LOCAL_RAY = "Started a local Ray instance"
JOINED_EXISTING_RAY = "Connecting to existing Ray cluster"


@dataclass(frozen=True)
class Program:
    """A whole program from the user pages: where it is (``examples/x.py``, ``README.md:42``) and its code."""

    where: str
    code: str


def fenced_programs(markdown: str, where: str) -> list[Program]:
    """The ```python fences of ``markdown`` (``where``: the file's path), each as a program."""
    programs, lines, index = [], markdown.splitlines(), 0
    while index < len(lines):
        opened = _FENCE_OPEN.match(lines[index])
        index += 1
        if not opened:
            continue
        start, fence, indent = index, opened["fence"], len(opened["indent"])
        while index < len(lines) and not lines[index].strip().startswith(fence):
            index += 1
        body = [line[indent:] if line[:indent].isspace() else line for line in lines[start:index]]
        programs.append(Program(f"{where}:{start}", "\n".join(body) + "\n"))
        index += 1
    return programs


def page_programs() -> list[Program]:
    """Every ```python fence of README.md and of docs/**/*.md, in path order."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [
        program
        for page in pages if page.is_file()
        for program in fenced_programs(page.read_text(encoding="utf-8"), str(page.relative_to(REPO)))
    ]  # fmt: skip


def program_key(code: str) -> str:
    """Equal for programs that differ only in comments, layout and their module docstring."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code.strip()
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def all_programs() -> list[Program]:
    """``examples/*.py`` then the pages' fences, each program once (the first place it appears)."""
    programs = [Program(str(path.relative_to(REPO)), path.read_text(encoding="utf-8")) for path in sorted(EXAMPLES.glob("*.py"))]
    unique: dict[str, Program] = {}
    for program in programs + page_programs():
        unique.setdefault(program_key(program.code), program)
    return list(unique.values())


def user_environment(ray_tmpdir: str, tmpdir: Path) -> dict[str, str]:
    """The environment a user's shell has, with a Ray temp folder of its own (see the module doc)."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    tests = str(Path(__file__).resolve().parent)
    path = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and Path(entry).resolve() != Path(tests)]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    else:
        env.pop("PYTHONPATH", None)
    env.update(RAY_TMPDIR=ray_tmpdir, TMPDIR=str(tmpdir), PYTHONUNBUFFERED="1")
    return env


@dataclass(frozen=True)
class Run:
    """A finished program: its exit code and output."""

    returncode: int
    stdout: str
    stderr: str

    def failure(self) -> str:
        return f"exit code {self.returncode}\n--- stdout ---\n{self.stdout[-4000:]}\n--- stderr ---\n{self.stderr[-6000:]}"


def run_program(code: str, folder: Path, timeout_s: float = PROGRAM_TIMEOUT_S) -> Run:
    """Run ``code`` as ``python program.py`` in the empty folder ``folder/run`` (see the module doc)."""
    source, cwd, tmpdir = folder / "program", folder / "run", folder / "tmp"
    for path in (source, cwd, tmpdir):
        path.mkdir(parents=True)
    (source / "program.py").write_text(code, encoding="utf-8")
    ray_tmpdir = private_ray_dir("ex-")
    try:
        process = subprocess.Popen(
            [sys.executable, str(source / "program.py")], cwd=cwd, env=user_environment(ray_tmpdir, tmpdir),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            stdout, stderr = process.communicate()
            pytest.fail(f"did not finish within {timeout_s:g} s\n" + Run(process.returncode, stdout, stderr).failure())
        finally:
            _kill_group(process)  # whatever the program left running
        run = Run(process.returncode, stdout, stderr)
        if run.returncode == 0 and STARTED_LOCAL_RAY in run.stderr:
            assert any(Path(ray_tmpdir, "ray").glob("session_*")), f"Ray's session is not below RAY_TMPDIR\n{run.failure()}"
        return run
    finally:
        shutil.rmtree(ray_tmpdir, ignore_errors=True)


def _kill_group(process: subprocess.Popen) -> None:
    """Kill the program's process group (the program, and the Ray it started if still running)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


# -- what each example prints -----------------------------------------------------------------


def _lines(stdout: str, pattern: str) -> list[re.Match[str]]:
    return [match for line in stdout.splitlines() if (match := re.fullmatch(pattern, line))]


def _sft_quickstart(stdout: str) -> None:
    steps = _lines(stdout, r"step (\d+): input_ids \(4, (\d+)\)")
    assert [int(m[1]) for m in steps] == [1, 2, 3] and all(0 < int(m[2]) <= 512 for m in steps)
    assert _lines(stdout, r"data checkpoint: .*/data_checkpoint/rl_data_state\.pt")


def _rl_feed_quickstart(stdout: str) -> None:
    steps = _lines(stdout, r"step (\d+): trained (\d+) prompts, dropped (\d+)")
    assert [int(m[1]) for m in steps] == [1, 2, 3] and all(int(m[2]) + int(m[3]) == 8 for m in steps)
    assert _lines(stdout, r"data checkpoint: .*/data_checkpoint/rl_data_state\.pt")
    (totals,) = _lines(stdout, r"feed totals: (\{.*\})")
    acked, dropped = sum(int(m[2]) for m in steps), sum(int(m[3]) for m in steps)
    assert ast.literal_eval(totals[1]) == {"taken": 24, "acked": acked, "dropped": dropped, "released": 0}


def _rl_loop(stdout: str) -> None:
    steps = _lines(stdout, r"step (\d+): 2 x input_ids \(8, (\d+)\), reward 16/16")
    assert [int(m[1]) for m in steps] == [1, 2, 3, 4, 3, 4]  # four steps, then 3 and 4 again after the rewind
    assert _lines(stdout, r"rewound to step 2")
    assert [m[1] for m in _lines(stdout, r"step (\d+) after the rewind: same prompts as before: True")] == ["3", "4"]


def _ray_train(stdout: str) -> None:
    assert _lines(stdout, re.escape("checkpoint files: ['model.pt', 'rl_data_state.pt']"))
    (state,) = _lines(stdout, r"data state: step 10, 2 ranks; loss (\S+)")
    assert float(state[1]) > 0
    (progress,) = _lines(stdout, r"coordinator: (\{.*\})")
    assert ast.literal_eval(progress[1]) == {"committed_step": 10, "handed_step": 10, "origin_step": 0, "rewinds": 0}


def _trl_grpo(stdout: str) -> None:
    assert _lines(stdout, r"optimizer steps 4; prompts acked 8, outstanding 0")  # 2 prompts a step; prefetched ones released
    for step in (2, 4):
        assert _lines(stdout, re.escape(f"checkpoint-{step}: feed state ['rl_data_state.pt', 'trl_callback.json']"))


def _adaptive_feed(stdout: str) -> None:
    statuses = _lines(stdout, r"step (\d+): epoch (\d+), skipped (\{.*\}), dropped (\{.*\})")
    assert [int(m[1]) for m in statuses] == [4, 8, 12]
    last = ast.literal_eval(statuses[-1][3])
    assert int(statuses[-1][2]) >= 1 and {"retired", "deferred"} <= set(last), "the filter skipped nothing"
    (totals,) = _lines(stdout, r"groups kept (\d+), dropped (\d+), samples per useful group (\S+)")
    assert int(totals[1]) >= 48 and int(totals[2]) == ast.literal_eval(statuses[-1][4]).get("zero_spread", 0)
    assert _lines(stdout, r"data checkpoint: .*/data_checkpoint/rl_data_state\.pt")


#: What each example must print (other programs: exit code 0 is checked).
EXPECTED_OUTPUT: dict[str, Callable[[str], None]] = {
    "examples/sft_quickstart.py": _sft_quickstart,
    "examples/rl_feed_quickstart.py": _rl_feed_quickstart,
    "examples/rl_loop.py": _rl_loop,
    "examples/ray_train.py": _ray_train,
    "examples/trl_grpo.py": _trl_grpo,
    "examples/adaptive_feed.py": _adaptive_feed,
}


def _params() -> list[object]:
    default_key = program_key((REPO / DEFAULT_RUN).read_text(encoding="utf-8"))
    return [
        pytest.param(program, id=program.where,
                     marks=() if program_key(program.code) == default_key else pytest.mark.slow)
        for program in all_programs()
    ]  # fmt: skip


@pytest.mark.timeout(PROGRAM_TIMEOUT_S + 60)
@pytest.mark.parametrize("program", _params())
def test_the_program_runs_as_pasted_into_an_empty_folder(program: Program, tmp_path: Path) -> None:
    run = run_program(program.code, tmp_path)
    assert run.returncode == 0, f"{program.where} failed\n{run.failure()}"
    assert JOINED_EXISTING_RAY not in run.stderr, f"{program.where} joined a Ray cluster it did not start\n{run.failure()}"
    check = EXPECTED_OUTPUT.get(program.where)
    if check is not None:
        try:
            check(run.stdout)
        except AssertionError as error:
            raise AssertionError(f"{program.where} printed other than expected: {error}\n{run.failure()}") from None


def test_every_example_is_checked_and_the_default_run_keeps_the_first_quickstart() -> None:
    examples = {program.where for program in all_programs() if program.where.startswith("examples/")}
    assert set(EXPECTED_OUTPUT) <= examples, f"examples whose output is checked but that are gone: {set(EXPECTED_OUTPUT) - examples}"
    assert DEFAULT_RUN in examples


@pytest.mark.parametrize("program", page_programs(), ids=lambda program: program.where)
def test_every_python_fence_of_the_pages_compiles(program: Program) -> None:
    try:
        compile(program.code, program.where, "exec")
    except SyntaxError as error:
        pytest.fail(f"{program.where} is fenced as python but is not a whole program: {error}\n"
                    "fence fragments, signatures and shell lines as what they are (```text, ```bash, ...)")


def test_a_fence_that_does_not_run_as_pasted_fails_its_run(tmp_path: Path) -> None:
    """The harness itself: a fence that uses a name it never defines is found and fails."""
    page = "Text.\n\n```python\nfrom pathlib import Path\n\nprint(Path(work))\n```\n\n```bash\nls\n```\n"
    (program,) = fenced_programs(page, "page.md")
    assert program.where == "page.md:3" and program.code == "from pathlib import Path\n\nprint(Path(work))\n"
    run = run_program(program.code, tmp_path, timeout_s=60)
    assert run.returncode == 1 and "NameError: name 'work' is not defined" in run.stderr


def test_the_program_environment_is_a_users_without_the_test_sessions_ray(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).resolve().parent), "/somewhere"]))
    env = user_environment("/tmp/ray-of-its-own", tmp_path)
    assert "RAY_ADDRESS" not in env and env["PYTHONPATH"] == "/somewhere"
    assert (env["RAY_TMPDIR"], env["TMPDIR"], env["RAY_AUTH_MODE"]) == ("/tmp/ray-of-its-own", str(tmp_path), "token")
