"""A frozen study's output says what it does: evaluating, chunks, held-out windows or items; never training, seeds, a
proxy's length or a 0x length (issue: words that fit). Its detectable gap comes from the paired unit differences the
test uses, and is about the gap the test then detects."""

import json
import math
import re

import numpy as np
import pytest
from conftest import frozen_run_args, write_space

# frozen and trained studies that race, as on one core: no race worker processes (conftest.one_core)
pytestmark = pytest.mark.usefixtures("one_usable_core")

FORBIDDEN = (r"seed", r"training", r"\b0x\b", r"proxy", r"\b0 steps")  # 1.00x is a FLOPs ratio, not a length


@pytest.mark.slow
def test_a_frozen_runs_output_has_no_training_words(cli, tmp_path, recurrent_checkpoint):
    space = write_space(
        tmp_path / "words.toml",
        search={"families": ["blocks"], "max_reuse": 2, "sampler": "grid", "race_seeds": 3, "max_seeds": 5},
        train={"eval_windows": 8},
    )
    db = tmp_path / "words.db"
    run = cli(
        *frozen_run_args(space, recurrent_checkpoint, "1.5x", f"sqlite:///{db}"),
    )
    assert run.returncode == 0, run.stderr
    study = json.loads(cli("studies", "--storage", f"sqlite:///{db}", "--json").stdout)["studies"][0]["study"]
    shown = [run.stdout, run.stderr]
    for command in ("trials", "pareto"):
        proc = cli(command, "--study", study, "--storage", f"sqlite:///{db}")
        assert proc.returncode == 0, proc.stderr
        shown += [proc.stdout]
    text = "\n".join(shown)
    assert "evaluating map" in text and "window chunk" in text
    for word in FORBIDDEN:
        lines = [line for line in text.splitlines() if re.search(word, line)]
        assert not lines, (word, lines[:5])
    summary = json.loads(cli("pareto", "--study", study, "--storage", f"sqlite:///{db}", "--json").stdout)
    assert all("map" in p and "reuse_map" in p for p in summary["pareto"])  # JSON: the map beside its counts


def test_the_paired_detectable_gap_is_about_what_the_test_detects(recurrent_checkpoint, token_cache):
    """Plant a known difference in real paired window differences (a damped block against the plain model on the
    tiny checkpoint, shifted to a true mean of the stated gap): the sequential test finds it about 80% of the time
    when chunks are drawn at random, as the stated detectable gap (at 80% power) says; at a third of it, rarely."""
    import dataclasses

    from ilr_search.analysis.unit_pairs import UnitPairs, UnitTest, unit_detectable_gap
    from ilr_search.config import DataConfig, TrainConfig
    from ilr_search.data.tokens import load_tokens
    from ilr_search.training.frozen import chunk_scores
    from ilr_search.training.pretrained import open_checkpoint

    cfg = open_checkpoint(str(recurrent_checkpoint), seq_len=64).config
    damped = dataclasses.replace(cfg, damping=0.5)
    data = load_tokens(DataConfig(tokenizer=f"file:{recurrent_checkpoint / 'tokenizer.json'}"), seq_len=64)
    chunks = range(1, 25)
    train = TrainConfig(steps=0, eval_windows=8, device="cpu", dtype="fp32")
    plain = chunk_scores(cfg, [0, 1, 2, 3], data, train, chunks)
    block = chunk_scores(damped, [0, 1, 2, 1, 2, 3], data, train, chunks)
    diffs = np.array(
        [np.subtract(b.scores, p.scores) for b, p in zip(block, plain, strict=True)]
    )  # 24 chunks x 8 windows
    centred = diffs - diffs.mean()  # the real paired spread, with no true difference
    test = UnitTest(0.05, 2, 6)
    observed = UnitPairs(tuple(range(6)), tuple(map(tuple, centred[:6])), False)
    gap = unit_detectable_gap(observed, test, 0.8)
    assert gap is not None and 0 < gap < 0.5
    rng = np.random.default_rng(3)

    def found(true_gap: float) -> float:
        hits = 0
        for _ in range(200):
            picked = centred[rng.choice(len(centred), size=6, replace=False)] - true_gap  # the map better by it
            hits += test.crossed_at(UnitPairs(tuple(range(6)), tuple(map(tuple, picked)), False)) is not None
        return hits / 200

    assert 0.6 <= found(gap) <= 0.97, gap
    assert found(gap / 3) < 0.4
    assert math.isfinite(gap)
