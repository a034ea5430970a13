"""``benchmarks/soak.py``: its slope, and a short soak that fails on clear linear memory growth."""

from __future__ import annotations

import random

import pytest

from benchmarks.soak import SERIES, SoakSettings, run_soak, second_half_slope

#: The largest second-half slope per 1,000 loop steps the short soak allows, per unit: about twice the
#: largest measured on 2 cores (anonymous memory: 3.6 idle, 10 under a load average of 10, in ~500-1,400
#: steps; objects 4-9; object store MB < 2). Warm-up still grows every process by 1-10 MB per 1,000 steps
#: that early (it decays with the steps: 0.3-0.9 over steps 1,600-3,200), so small leaks are for the
#: 30-minute run (``python -m benchmarks.soak``) to show. USS is not bounded: rank 0 of B's USS jumps by a
#: few MB whenever B's rank 1 dies (pages the two shared become unique to rank 0, see benchmarks/soak.py);
#: anonymous memory does not move with other processes.
MAX_SLOPE_PER_1000_STEPS = {"anon MB": 20.0, "MB": 10.0, "objects": 25.0}
#: Shared object store usage at the end of the short soak: the pending and recently committed batches only
#: (B's are ~0.2 MB each; measured: at most 6 MB).
MAX_PLASMA_MB_AT_END = 20.0


def test_a_flat_noisy_series_has_a_slope_near_zero():
    noise = random.Random(0)
    steps = list(range(0, 10_000, 100))
    values = [300 + noise.uniform(-0.5, 0.5) for _ in steps]
    assert abs(second_half_slope(steps, values)) < 0.05


def test_a_linear_series_gives_its_slope_per_1000_steps():
    steps = list(range(0, 5_000, 50))
    assert second_half_slope(steps, [100 + 0.002 * s for s in steps]) == pytest.approx(2.0)


def test_only_the_second_half_counts():
    steps = list(range(0, 2_000, 10))
    warm_up_then_flat = [100 + min(s, 900) * 0.05 for s in steps]  # grows until step 900, flat from 1,000 on
    assert second_half_slope(steps, warm_up_then_flat) == pytest.approx(0.0)


def test_a_bounded_series_high_in_its_last_samples_is_not_growth():
    """A CI run's object store objects: 4-6, then 14 and 16 in the last two samples of a short run (after
    a kill); a least-squares fit read +27 objects per 1,000 steps."""
    steps = [1, 29, 59, 101, 124, 157, 186, 201, 202, 225, 263, 293, 302, 314, 332, 333, 338, 364, 389, 391, 395, 401,
             453, 501, 503, 529, 557]  # fmt: skip
    objects = [2, 6, 8, 6, 4, 6, 6, 6, 6, 4, 6, 6, 4, 6, 6, 4, 4, 6, 4, 6, 4, 6, 4, 6, 5, 14, 16]
    assert abs(second_half_slope(steps, objects)) < 10


def test_a_steady_leak_under_noise_gives_its_rate():
    noise = random.Random(1)
    steps = list(range(0, 600, 20))
    objects = [5 + s / 40 + noise.choice([-2, 0, 2]) for s in steps]  # one object every 40 steps
    assert second_half_slope(steps, objects) == pytest.approx(25, abs=5)


def test_missing_values_are_left_out_and_too_few_points_give_none():
    assert second_half_slope([0, 100, 200, 300], [None, None, 5.0, 5.5]) == pytest.approx(5.0)
    assert second_half_slope([0, 100, 200, 300], [1.0, 2.0, None, 3.0]) is None
    assert second_half_slope([], []) is None
    with pytest.raises(ValueError, match="3 steps, 2 values"):
        second_half_slope([0, 1, 2], [1.0, 2.0])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_soak_with_every_fault_shows_no_process_growing(ray_session, energon_dataset, tmp_path):
    """2.5 minutes (~500-1,400 steps on 2 cores) of coordinators A (unpacked, 0 workers) and B (packed,
    2 Energon workers) and the prompt feed, with rank kills, checkpoints and rewinds every few dozen steps.

    Catches a leak that grows linearly with the steps, at these sizes or more: ~20 KB per step kept in
    a coordinator, the feed or the driver (e.g. a reference to each of B's ~200 KB batches); per sample
    read, ~10 KB in A's rank 0 (2 samples per step) or ~1.3 KB in B's rank 0 or its Energon workers
    (16 per step); an object left in an owner's store or in the shared object store every 40 steps;
    one of B's batches left in the object store every 20 steps. Also that every fault happened and
    every kill was replaced, and that the object store holds little at the end.
    """
    settings = SoakSettings(minutes=2.5, kill_every=100, checkpoint_every=20, rewind_every=45, sample_every_s=5.0)
    results = run_soak(settings, out=tmp_path, sft_dataset=energon_dataset.path)

    faults = results["faults"]
    assert all(count > 0 for count in faults["kills"].values()), f"a service was never killed: {faults['kills']}"
    assert faults["checkpoints"] > 0 and faults["rewinds"] > 0, f"no checkpoint or no rewind happened: {faults}"
    for key, kills in faults["kills"].items():
        restarts = results["owner_counts"][key]["restarts"]
        assert sum(restarts) == kills, f"{key} replaced ranks {restarts} times (per rank), expected {kills} (the kills)"
    rows = {(row["unit"], row["series"]): row for row in results["rows"]}
    assert list(rows) == [(unit, name) for name, unit, _, _ in SERIES]
    unmeasured = [name for name, row in rows.items() if row["slope_per_1000_steps"] is None]
    assert not unmeasured, f"series without a second-half slope (fewer than 2 readings): {unmeasured}"
    growing = [f"{series}: {row['slope_per_1000_steps']:+.3f} {unit} per 1,000 steps ({row['start']} -> {row['end']})"
               for (unit, series), row in rows.items()
               if unit in MAX_SLOPE_PER_1000_STEPS and row["slope_per_1000_steps"] > MAX_SLOPE_PER_1000_STEPS[unit]]  # fmt: skip
    assert not growing, f"series growing in the second half of {results['steps']} steps: {growing}"
    plasma = rows[("MB", "plasma")]["end"]
    assert plasma <= MAX_PLASMA_MB_AT_END, f"the object store holds {plasma:.1f} MB at the end, expected <= {MAX_PLASMA_MB_AT_END}"
    for name in ("soak.json", "soak.md", "soak.png"):
        assert (tmp_path / name).stat().st_size > 0, name
