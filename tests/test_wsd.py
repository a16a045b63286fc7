"""The wsd (warmup-stable-decay) learning-rate schedule and its continuation: a longer run continues a shorter
run's stable-phase checkpoint and ends where a straight run of its own length ends."""

import math
from dataclasses import replace

import pytest
import torch
from conftest import TINY_SPACE

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.data.tokens import load_tokens
from ilr_search.space import SpaceError, load_space
from ilr_search.training.schedule import reuse_map_schedule
from ilr_search.training.train import lr_at, train_proxy


def cosine_reference(step: int, cfg: TrainConfig) -> float:
    """The cosine schedule as it was before wsd existed (train.lr_at at commit 3cd8de2), written out."""
    warmup = max(1, round(cfg.warmup_frac * cfg.steps))
    if step <= warmup:
        return cfg.lr * step / warmup
    progress = (step - warmup) / max(1, cfg.steps - warmup)
    floor = cfg.min_lr_frac * cfg.lr
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("steps,warmup_frac", [(200, 0.1), (37, 0.05), (500, 0.0)])
def test_the_default_schedule_is_todays_cosine_bit_for_bit(steps, warmup_frac):
    cfg = TrainConfig(steps=steps, warmup_frac=warmup_frac)
    assert cfg.lr_schedule == "cosine"
    assert [lr_at(s, cfg) for s in range(1, steps + 1)] == [cosine_reference(s, cfg) for s in range(1, steps + 1)]


def test_wsd_warms_up_holds_the_peak_then_cools_down_by_one_minus_sqrt():
    cfg = TrainConfig(steps=200, lr=1e-2, warmup_frac=0.1, min_lr_frac=0.1, lr_schedule="wsd", cooldown_frac=0.2)
    lrs = {s: lr_at(s, cfg) for s in range(1, 201)}
    assert cfg.warmup_length == 20 and cfg.cooldown_start == 160
    assert lrs[10] == pytest.approx(0.5e-2) and lrs[20] == 1e-2
    assert all(lrs[s] == 1e-2 for s in range(20, 161))  # the stable phase is exactly the peak
    floor = 1e-3
    for s in (161, 170, 180, 199):
        assert lrs[s] == pytest.approx(floor + (1e-2 - floor) * (1 - math.sqrt((s - 160) / 40)))
    assert lrs[200] == pytest.approx(floor)
    assert all(lrs[s + 1] < lrs[s] for s in range(160, 200))


def test_a_fixed_warmup_does_not_scale_with_the_run():
    short, long = (TrainConfig(steps=n, warmup_steps=20, lr_schedule="wsd") for n in (200, 800))
    assert [lr_at(s, short) for s in range(1, 161)] == [lr_at(s, long) for s in range(1, 161)]


def test_a_space_refuses_a_bad_schedule():
    with pytest.raises(SpaceError, match="lr_schedule"):
        load_space(TINY_SPACE, {"train": {"lr_schedule": "step"}})
    with pytest.raises(SpaceError, match="cooldown_frac"):
        load_space(TINY_SPACE, {"train": {"lr_schedule": "wsd", "cooldown_frac": 1.0}})
    with pytest.raises(SpaceError, match="runs into the cooldown"):
        load_space(TINY_SPACE, {"train": {"lr_schedule": "wsd", "warmup_frac": 0.9, "cooldown_frac": 0.5}})


def tiny():
    model = ModelConfig(vocab_size=256, n_layers=2, d_model=32, n_heads=2, seq_len=64)
    train = TrainConfig(
        steps=40,
        batch_size=4,
        eval_windows=4,
        dtype="fp32",
        device="cpu",
        checkpoint_every=0,
        lr=3e-3,
        lr_schedule="wsd",
        cooldown_frac=0.25,
        warmup_steps=4,
        eval_fractions=(1.0,),
    )
    return model, train, reuse_map_schedule([2, 1])


def test_a_continued_run_ends_where_the_straight_run_of_its_length_ends(token_cache, tmp_path):
    data = load_tokens(DataConfig(), root=token_cache)
    model, train, schedule = tiny()
    short_cfg, long_cfg = replace(train, steps=20), replace(train, steps=40)
    kept: list[torch.nn.Module] = []
    straight = train_proxy(model, schedule, data, long_cfg, on_trained=kept.append)

    trunk = tmp_path / "trunk-20.pt"
    short = train_proxy(model, schedule, data, short_cfg, stable_checkpoint=trunk)
    assert short.steps == 20 and torch.load(trunk, weights_only=True)["step"] == short_cfg.cooldown_start == 15
    continued = train_proxy(model, schedule, data, long_cfg, start_from=trunk, on_trained=kept.append)

    assert continued.resumed_from_step == 15 and continued.steps == 40
    assert continued.val_loss == pytest.approx(straight.val_loss, rel=1e-5, abs=1e-6)
    assert continued.val_loss != pytest.approx(short.val_loss, rel=1e-3)  # the continuation trained on
    for (name, a), (_, b) in zip(kept[0].state_dict().items(), kept[1].state_dict().items(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)


def test_a_checkpoint_from_a_cooldown_or_past_the_stable_phase_is_refused(token_cache, tmp_path):
    data = load_tokens(DataConfig(), root=token_cache)
    model, train, schedule = tiny()
    trial = tmp_path / "trial.pt"  # a trial checkpoint at step 18, inside the 20-step run's cooldown
    train_proxy(model, schedule, data, replace(train, steps=20, checkpoint_every=18), checkpoint_path=trial)
    with pytest.raises(ValueError, match="not in the constant phase"):
        train_proxy(model, schedule, data, train, start_from=trial)
    trunk = tmp_path / "trunk-40.pt"  # taken at step 30: past a 32-step run's cooldown start (24)
    train_proxy(model, schedule, data, train, stable_checkpoint=trunk)
    with pytest.raises(ValueError, match="after this run's cooldown starts"):
        train_proxy(model, schedule, data, replace(train, steps=32), start_from=trunk)


def test_a_study_stores_the_schedule_only_where_it_is_not_cosine(tmp_path):
    import optuna

    from ilr_search.commands.audit import stored_space
    from ilr_search.search.plan import CONFIG_ATTR, plan_study
    from ilr_search.search.race_results import lr_schedule

    cosine = plan_study(load_space(TINY_SPACE), "2x", None)
    assert not {"lr_schedule", "warmup_steps", "cooldown_frac"} & set(cosine.config["train"])  # names unchanged
    assert lr_schedule(cosine.config) == f"cosine(warmup {cosine.space.train.warmup_frac:g}, floor 0.1)"

    wsd_space = load_space(TINY_SPACE, {"train": {"lr_schedule": "wsd", "warmup_steps": 3, "cooldown_frac": 0.3}})
    wsd = plan_study(wsd_space, "2x", None)
    assert {k: wsd.config["train"][k] for k in ("lr_schedule", "warmup_steps", "cooldown_frac")} == {
        "lr_schedule": "wsd",
        "warmup_steps": 3,
        "cooldown_frac": 0.3,
    }
    assert wsd.name != cosine.name
    assert lr_schedule(wsd.config) == "wsd(warmup 3 steps, 1-sqrt cooldown 0.3, floor 0.1)"

    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name=wsd.name)
    study.set_user_attr(CONFIG_ATTR, wsd.config)
    audited = stored_space(study, 4 * wsd_space.train.steps).train  # the audit retrains with the same schedule
    assert (audited.lr_schedule, audited.warmup_steps, audited.cooldown_frac) == ("wsd", 3, 0.3)
