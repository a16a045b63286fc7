"""The fused trainer (issue 20): K members trained in lockstep equal K separate train_proxy runs.

Real tiny models in fp32 on CPU. Tolerance: 1e-4 absolute on every validation loss (batched matmuls sum in
another order than the single model's, so losses agree to ~1e-6, not bit for bit)."""

from dataclasses import replace

import pytest
import torch

from ilr_search.config import DataConfig, ModelConfig, TrainConfig
from ilr_search.data.tokens import load_tokens
from ilr_search.training.fused import FusedGroup, FusionUnsupported, load_member, train_fused
from ilr_search.training.schedule import block_schedule, reuse_map_schedule
from ilr_search.training.train import Member, TrainResult, build_model, build_optimizer, train_proxy

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def data(token_cache):
    return load_tokens(DataConfig(), root=token_cache)


def tiny_model(pe: str = "rope", n_layers: int = 3) -> ModelConfig:
    return ModelConfig(vocab_size=256, n_layers=n_layers, d_model=16, n_heads=2, seq_len=32, pe=pe)


def tiny_train(**kw) -> TrainConfig:
    base = TrainConfig(
        steps=30,
        batch_size=4,
        lr=3e-3,
        eval_fractions=(0.25, 0.5, 1.0),
        eval_windows=8,
        dtype="fp32",
        device="cpu",
        checkpoint_every=0,
    )
    return replace(base, **kw)


def assert_same_run(fused: TrainResult, single: TrainResult, resumed_from: int = 0) -> None:
    """The same run; `resumed_from`: `fused` resumed at that step (its batch digest covers only the steps after)."""
    assert (fused.status, fused.steps, fused.tokens, fused.params, fused.resumed_from_step) == (
        single.status,
        single.steps,
        single.tokens,
        single.params,
        resumed_from,
    )
    if not resumed_from:
        assert fused.batch_digest == single.batch_digest != 0
    assert fused.reason.split(" became ")[0] == single.reason.split(" became ")[0]
    assert [p.step for p in fused.curve] == [p.step for p in single.curve]
    if not resumed_from:  # the training loss's window means (a resumed run's start later, at other reads)
        assert [p.step for p in fused.train_curve] == [p.step for p in single.train_curve]
        for a, b in zip(fused.train_curve, single.train_curve, strict=True):
            assert a.loss == pytest.approx(b.loss, abs=TOLERANCE)
    for a, b in zip(fused.curve, single.curve, strict=True):
        assert a.val_loss == pytest.approx(b.val_loss, abs=TOLERANCE)
        assert a.val_bpb == pytest.approx(b.val_bpb, abs=2 * TOLERANCE)  # bits: nats / ln 2
    if single.status == "diverged":
        assert fused.val_loss != fused.val_loss  # nan, as train_proxy reports
    else:
        assert fused.val_loss == pytest.approx(single.val_loss, abs=TOLERANCE)


class Killed(KeyboardInterrupt):
    """Ctrl-C in the middle of a group (a real KeyboardInterrupt, raised from a callback)."""


# Three members: the plain stack, a reuse map, and block recurrence (schedules of 3, 6 and 6 runs), two seeds.
SCHEDULES = [reuse_map_schedule([1, 1, 1]), reuse_map_schedule([3, 1, 2]), block_schedule(3, 2)]
SEEDS = [0, 1, 0]


@pytest.mark.slow
@pytest.mark.parametrize("pe", ["nope", "rope", "learned", "alibi"])
def test_fused_members_equal_their_single_runs(data, pe):
    model_cfg, cfg = tiny_model(pe), tiny_train()
    fused = train_fused(model_cfg, SCHEDULES, data, cfg, seeds=SEEDS)
    assert len(fused) == len(SCHEDULES)
    for schedule, seed, result in zip(SCHEDULES, SEEDS, fused, strict=True):
        assert result.schedule == schedule
        assert_same_run(result, train_proxy(model_cfg, schedule, data, replace(cfg, seed=seed)))
    assert fused[0].curve[-1].val_loss != fused[1].curve[-1].val_loss  # the members really differ
    assert all(r.train_curve for r in fused)  # every member keeps its training-loss curve


def test_where_masking_equals_prefix_masking(data):
    model_cfg, cfg = tiny_model(), tiny_train(steps=12)
    prefix = train_fused(model_cfg, SCHEDULES, data, cfg, seeds=SEEDS, length_masking="prefix")
    where = train_fused(model_cfg, SCHEDULES, data, cfg, seeds=SEEDS, length_masking="where")
    for a, b in zip(prefix, where, strict=True):
        assert_same_run(a, b)


@pytest.mark.slow
def test_a_diverged_and_a_pruned_member_leave_and_the_others_go_on_as_alone(data, tmp_path):
    # Four members train 10 steps and checkpoint; member 0's checkpoint then gets its embedding scaled by 1e3
    # (a model whose logits are far too large: its training loss passes twice a uniform guess's at once). All
    # four resume from their checkpoints, fused and alone: member 0 diverges at its first step and leaves;
    # member 2 is pruned at the second evaluation by its callback; members 1 and 3 run to the end.
    model_cfg, cfg = tiny_model(n_layers=2), tiny_train(steps=48, checkpoint_every=10)
    schedules = [[0, 1], [0, 1], block_schedule(2, 3), reuse_map_schedule([3, 1])]
    seeds = [1, 0, 0, 1]
    paths = [tmp_path / f"member{k}.pt" for k in range(len(schedules))]
    first_eval, second_eval = cfg.eval_steps[:2]
    assert first_eval > 10

    def stop_at_11(s, n, loss):
        if s == 11:
            raise Killed

    with pytest.raises(Killed):
        train_fused(model_cfg, schedules, data, cfg, on_step=[stop_at_11] * 4, checkpoint_paths=paths, seeds=seeds)
    state = torch.load(paths[0], weights_only=True)
    state["model"]["embed.weight"] *= 1e3
    torch.save(state, paths[0])
    for path in paths:  # the same starting points for the single runs
        path.with_suffix(".single").write_bytes(path.read_bytes())

    def callbacks(record: list):
        on_eval = [None, None, lambda point: point.step >= second_eval, None]
        on_step = [lambda s, n, loss, k=k: record.append((k, s, round(loss, 4))) for k in range(len(schedules))]
        return on_eval, on_step

    fused_steps: list = []
    on_eval, on_step = callbacks(fused_steps)
    fused = train_fused(
        model_cfg, schedules, data, cfg, on_eval=on_eval, on_step=on_step, checkpoint_paths=paths, seeds=seeds
    )
    single_steps: list = []
    on_eval, on_step = callbacks(single_steps)
    singles = [
        train_proxy(
            model_cfg,
            s,
            data,
            replace(cfg, seed=seed),
            on_eval=e,
            on_step=o,
            checkpoint_path=path.with_suffix(".single"),
        )
        for s, seed, e, o, path in zip(schedules, seeds, on_eval, on_step, paths, strict=True)
    ]
    assert [r.status for r in singles] == ["diverged", "ok", "stopped", "ok"]  # the scenario holds
    for a, b in zip(fused, singles, strict=True):
        assert_same_run(a, b, resumed_from=10)
    assert sorted(fused_steps) == sorted(single_steps)  # each member's on_step saw its own steps and losses
    assert fused[0].steps == 10 and fused[2].steps == second_eval and fused[1].steps == fused[3].steps == cfg.steps


def test_one_fused_adamw_equals_one_adamw_per_member(data):
    """AdamW over the stacked tensors, with per-member clipping, equals each member's own AdamW after
    clip_grad_norm_: the same gradients in, the same weights out, step after step."""
    model_cfg, cfg = tiny_model(), tiny_train(grad_clip=0.05, weight_decay=0.1, lr=1e-2)
    device = torch.device("cpu")
    seeds = [0, 1, 2]
    members = [Member(list(s), seed) for s, seed in zip(SCHEDULES, seeds, strict=True)]
    states = [load_member(model_cfg, cfg, m, device) for m in members]
    group = FusedGroup(model_cfg, cfg, members, states, device, torch.float32, False)
    models = [build_model(model_cfg, seed) for seed in seeds]
    optimizers = [build_optimizer(m, cfg, device) for m in models]
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        for p in group.params.values():
            p.grad = torch.randn(p.shape, generator=generator)  # big enough that clipping acts
        for k, model in enumerate(models):
            member_grads = group.layout.unstack(
                {key: p.grad.clone() for key, p in group.params.items()}, group.members.index(members[k])
            )
            for name, p in model.named_parameters():
                p.grad = member_grads[name].clone()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizers[k].step()
        group.clip_gradients()
        group.optimizer.step()
    for k, model in enumerate(models):
        fused_weights = group.layout.unstack(
            {key: p.detach() for key, p in group.params.items()}, group.members.index(members[k])
        )
        assert set(fused_weights) == {name for name, _ in model.named_parameters()}
        for name, p in model.named_parameters():
            torch.testing.assert_close(fused_weights[name], p.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_killed_group_resumes_from_its_checkpoints_with_the_same_results(data, tmp_path):
    model_cfg = tiny_model()
    cfg = tiny_train(checkpoint_every=10)  # evaluations at 8, 15, 30; checkpoints at 10 and 20
    paths = [tmp_path / f"member{k}.pt" for k in range(len(SCHEDULES))]
    uninterrupted = train_fused(model_cfg, SCHEDULES, data, replace(cfg, checkpoint_every=0), seeds=SEEDS)

    def kill_at_15(point):
        if point.step == 15:
            raise Killed
        return False

    with pytest.raises(Killed):
        train_fused(
            model_cfg, SCHEDULES, data, cfg, on_eval=[kill_at_15, None, None], checkpoint_paths=paths, seeds=SEEDS
        )
    assert all(torch.load(p, weights_only=True)["step"] == 10 for p in paths)
    resumed = train_fused(model_cfg, SCHEDULES, data, cfg, checkpoint_paths=paths, seeds=SEEDS)
    for a, b in zip(resumed, uninterrupted, strict=True):
        assert_same_run(a, b, resumed_from=10)
    # A member resumes alone, with train_proxy, from its own checkpoint (the files were rewritten at step 20).
    alone = train_proxy(model_cfg, SCHEDULES[1], data, replace(cfg, seed=SEEDS[1]), checkpoint_path=paths[1])
    assert_same_run(alone, uninterrupted[1], resumed_from=20)
    assert not list(tmp_path.glob(".*tmp*"))


@pytest.mark.slow
def test_members_resuming_from_different_steps_train_apart_and_match(data, tmp_path):
    model_cfg = tiny_model()
    cfg = tiny_train(checkpoint_every=10)
    paths = [tmp_path / "a.pt", tmp_path / "b.pt"]
    schedules, seeds = SCHEDULES[:2], SEEDS[:2]

    def kill_at_15(point):
        if point.step == 15:
            raise Killed
        return False

    with pytest.raises(Killed):  # member 0 alone, killed after its checkpoint at step 10
        train_fused(
            model_cfg, schedules[:1], data, cfg, on_eval=[kill_at_15], checkpoint_paths=paths[:1], seeds=seeds[:1]
        )
    results = train_fused(model_cfg, schedules, data, cfg, checkpoint_paths=paths, seeds=seeds)
    assert [r.resumed_from_step for r in results] == [10, 0]
    for i, (schedule, seed, result) in enumerate(zip(schedules, seeds, results, strict=True)):
        # checkpointed like the member (a checkpoint is also a read of the training loss), from scratch
        single = train_proxy(model_cfg, schedule, data, replace(cfg, seed=seed), checkpoint_path=tmp_path / f"s{i}.pt")
        assert_same_run(result, single, resumed_from=result.resumed_from_step)


def test_per_layer_learning_rates_are_refused(data):
    with pytest.raises(FusionUnsupported, match="does not support repeat_scale=lr"):
        train_fused(replace(tiny_model(), repeat_scale="lr"), SCHEDULES, data, tiny_train(steps=2))


@pytest.mark.parametrize(
    "knob",
    [
        {"injection": "add"},
        {"injection": "gated"},
        {"iteration_encoding": True, "max_reuse": 3},
        {"iteration_norms": True, "max_reuse": 3},
    ],
    ids=["injection-add", "injection-gated", "iteration_encoding", "iteration_norms"],
)
@pytest.mark.parametrize("masking", ["prefix", "where"])
def test_knobs_that_add_parameters_or_ops_train_fused_as_alone(data, knob, masking):
    """The knobs run in model.before_run for every member: at the second position one member repeats its layer
    and two run theirs for the first time, so each knob acts on some members and not on others."""
    model_cfg, cfg = replace(tiny_model(), **knob), tiny_train()
    fused = train_fused(model_cfg, SCHEDULES, data, cfg, seeds=SEEDS, length_masking=masking)
    off = train_fused(tiny_model(), SCHEDULES, data, cfg, seeds=SEEDS, length_masking=masking)
    for schedule, seed, result, plain in zip(SCHEDULES, SEEDS, fused, off, strict=True):
        assert_same_run(result, train_proxy(model_cfg, schedule, data, replace(cfg, seed=seed)))
        if schedule != [0, 1, 2]:  # the knob acts on repeats (iteration_encoding on every pass)
            assert result.val_loss != plain.val_loss


@pytest.mark.parametrize(
    "options",
    [
        {"n_kv_heads": 1, "qkv_bias": True, "qk_norm": True, "tie_embeddings": False},
        {"n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "pe": "alibi"},
    ],
    ids=["gqa-bias-qknorm-untied", "head_dim-alibi"],
)
def test_architecture_options_train_fused_as_alone(data, options):
    """Grouped-query attention, q/k/v biases, q/k norms, an explicit head_dim (decoder_layer's) and an untied head
    (stacked like the embedding): each member equals its single run."""
    model_cfg, cfg = replace(tiny_model(), **options), tiny_train()
    fused = train_fused(model_cfg, SCHEDULES, data, cfg, seeds=SEEDS)
    for schedule, seed, result in zip(SCHEDULES, SEEDS, fused, strict=True):
        assert_same_run(result, train_proxy(model_cfg, schedule, data, replace(cfg, seed=seed)))


@pytest.mark.parametrize("masking", ["prefix", "where"])
def test_repeat_scale_residual_members_equal_their_single_runs(data, masking):
    """Each member's branches at each position scaled by 1 / (its layer's run count), as the single model does;
    the members' factors differ at one position (layer 0 runs once, three times, twice)."""
    model_cfg, cfg = replace(tiny_model(), repeat_scale="residual"), tiny_train()
    fused = train_fused(model_cfg, SCHEDULES, data, cfg, seeds=SEEDS, length_masking=masking)
    off = train_fused(tiny_model(), SCHEDULES, data, cfg, seeds=SEEDS, length_masking=masking)
    for schedule, seed, result, plain in zip(SCHEDULES, SEEDS, fused, off, strict=True):
        assert_same_run(result, train_proxy(model_cfg, schedule, data, replace(cfg, seed=seed)))
        assert (result.val_loss == plain.val_loss) is (schedule == [0, 1, 2])  # only the repeats are scaled


def test_init_depth_is_supported_through_build_model(data):
    model_cfg, cfg = replace(tiny_model(), init_depth=6), tiny_train(steps=8, eval_fractions=(1.0,))
    fused = train_fused(model_cfg, SCHEDULES[1:], data, cfg, seeds=SEEDS[1:])
    for schedule, seed, result in zip(SCHEDULES[1:], SEEDS[1:], fused, strict=True):
        assert_same_run(result, train_proxy(model_cfg, schedule, data, replace(cfg, seed=seed)))


def test_a_group_whose_members_all_stop_at_one_evaluation_ends_there(data):
    """Every member pruned at the same evaluation (a whole group behind the front): the group ends at that step
    with each member stopped there, as each would alone (the default run met this)."""
    model_cfg, cfg = tiny_model(), tiny_train()
    stop_at = cfg.eval_steps[0]
    fused = train_fused(
        model_cfg, SCHEDULES, data, cfg, seeds=SEEDS, on_eval=[lambda p: p.step >= stop_at] * len(SCHEDULES)
    )
    for schedule, seed, result in zip(SCHEDULES, SEEDS, fused, strict=True):
        single = train_proxy(model_cfg, schedule, data, replace(cfg, seed=seed), on_eval=lambda p: p.step >= stop_at)
        assert result.status == single.status == "stopped" and result.steps == stop_at
        assert_same_run(result, single)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"n_kv_heads": 1, "qkv_bias": True, "qk_norm": True},  # grouped-query attention, biases, q/k norms
        {"head_dim": 4, "pe": "alibi"},
    ],
    ids=["plain", "gqa-bias-qknorm", "head_dim-alibi"],
)
def test_one_decoder_layer_gives_each_member_what_the_single_model_gives(options):
    """model.decoder_layer is the one layer: a member's output in a group of three (batched kernels) equals its own
    model's DecoderLayer (m = 1, the plain kernels), for every architecture option the layer has."""
    from ilr_search.training.model import LAYER_WEIGHTS, alibi_bias, decoder_layer, rope_tables

    cfg = replace(tiny_model(pe=options.pop("pe", "rope")), **options)
    layers = [build_model(cfg, seed).layers[0] for seed in range(3)]
    x = torch.randn(3, 2, cfg.seq_len, cfg.d_model, generator=torch.Generator().manual_seed(0))
    rope = rope_tables(cfg.seq_len, cfg.head_size, cfg.rope_base, x.device) if cfg.pe == "rope" else None
    alibi = alibi_bias(cfg.n_heads, cfg.seq_len, x.device) if cfg.pe == "alibi" else None
    named = [dict(layer.named_parameters()) for layer in layers]
    weights = tuple(torch.stack([p[name] for p in named]) if name in named[0] else None for name in LAYER_WEIGHTS)
    assert all((w is None) == (name not in named[0]) for w, name in zip(weights, LAYER_WEIGHTS, strict=True))
    scale = torch.tensor([1.0, 0.5, 0.25]).view(3, 1, 1, 1)
    with torch.no_grad():
        together = decoder_layer(x, weights, rope, None, alibi, scale, cfg.n_heads, cfg.kv_heads, cfg.norm_eps)
        for k, layer in enumerate(layers):
            alone = layer(x[k], rope, alibi, branch_scale=float(scale[k]) if k else None)
            torch.testing.assert_close(together[k], alone, rtol=1e-5, atol=1e-6)


def test_a_run_gives_the_same_numbers_alone_or_in_any_group_where_its_study_fuses(data):
    """With K > 1 every fusable run trains through the fused trainer, a group of one included, and a member's
    numbers do not depend on the members beside it: the race's workers, which claim runs by timing, store the same
    results whichever runs each one took. Exact equality, in fp32 on this CPU."""
    from ilr_search.training.jobs import Job, train_jobs

    model_cfg, cfg = tiny_model(), tiny_train(steps=24)
    jobs = [Job(model_cfg, list(s), replace(cfg, seed=seed)) for s, seed in zip(SCHEDULES[:3], (1, 2, 3), strict=True)]
    together = train_jobs(jobs, data, fuse=3)
    for k, job in enumerate(jobs):
        (alone,) = train_jobs([job], data, fuse=2)
        assert alone.val_loss == together[k].val_loss and alone.curve == together[k].curve
        assert alone.train_curve == together[k].train_curve
    (pair_member, _) = train_jobs([jobs[0], jobs[2]], data, fuse=2)
    assert pair_member.curve == together[0].curve


def test_schedule_positions_give_each_running_member_its_layer_repeat_and_branch_factor():
    """model.schedule_positions is the recurrence, for the model (one member) and the fused group alike."""
    from ilr_search.training.model import schedule_positions

    cfg, cpu = replace(tiny_model(), damping=0.5), torch.device("cpu")
    positions = schedule_positions(cfg, [[0, 0, 1, 2], [0, 1, 2]], device=cpu)
    assert [p.layers for p in positions] == [[0, 0], [0, 1], [1, 2], [2]]  # the shorter member stops running
    assert [p.repeats for p in positions] == [[0, 0], [1, 0], [0, 0], [0]]
    assert positions[0].scale is None and positions[1].scale.flatten().tolist() == [0.5, 1.0]
    assert positions[1].index.tolist() == [[0, 1], [0, 1], [1, 0]]  # (member, layer, repeat) of each running one
    where = schedule_positions(cfg, [[0, 0, 1, 2], [0, 1, 2]], device=cpu, masking="where")
    assert where[3].layers == [2, 0] and where[3].active.flatten().tolist() == [True, False]
    assert [p.scale for p in schedule_positions(cfg, [[0, 0, 1, 2]])] == [None, 0.5, None, None]  # Python floats
    with pytest.raises(ValueError, match="longest first"):
        schedule_positions(cfg, [[0, 1, 2], [0, 0, 1, 2]])
    with pytest.raises(ValueError, match="more than max_reuse 2"):
        schedule_positions(replace(cfg, iteration_encoding=True, max_reuse=2), [[0, 0, 0, 1, 2]])
