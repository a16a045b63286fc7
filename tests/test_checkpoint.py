from dataclasses import replace

import pytest
import torch

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.data.tokens import load_tokens
from ilr_search.training.schedule import reuse_map_schedule
from ilr_search.training.train import train_proxy


class Crash(Exception):
    pass


@pytest.mark.slow
def test_a_retried_run_resumes_from_its_checkpoint_and_ends_the_same(token_cache, tmp_path):
    data = load_tokens(DataConfig(), root=token_cache)
    cfg = ModelConfig(vocab_size=256, n_layers=2, d_model=32, n_heads=2, seq_len=64)
    train = TrainConfig(steps=30, batch_size=4, eval_windows=4, dtype="fp32", device="cpu", checkpoint_every=10)
    schedule = reuse_map_schedule([2, 1])
    uninterrupted = train_proxy(cfg, schedule, data, replace(train, checkpoint_every=0))

    path = tmp_path / "ckpt" / "2-1.pt"

    def crash_at_25(step, steps, loss):
        if step == 25:
            raise Crash

    with pytest.raises(Crash):
        train_proxy(cfg, schedule, data, train, on_step=crash_at_25, checkpoint_path=path)
    assert path.exists()
    state = torch.load(path, weights_only=True)  # tensors and plain numbers only
    assert state["step"] == 20
    resumed = train_proxy(cfg, schedule, data, train, checkpoint_path=path)
    assert resumed.resumed_from_step == 20 and resumed.steps == 30
    assert resumed.val_loss == pytest.approx(uninterrupted.val_loss, rel=1e-6, abs=1e-6)
    assert [p.step for p in resumed.curve] == [p.step for p in uninterrupted.curve]
    for a, b in zip(resumed.curve, uninterrupted.curve, strict=True):
        assert a.val_loss == pytest.approx(b.val_loss, rel=1e-6, abs=1e-6)
    assert not list(path.parent.glob(".*tmp*"))  # atomic writes leave no temporary files
