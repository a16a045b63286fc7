"""Chaos: 3 workers on one study, one SIGKILLed before, during and after a claim wait
(tests/reliability/chaos.py), on the journal, SQLite and PostgreSQL. Every step of the scenario waits on an event,
so the test holds at any load; it shares the cores with the suite's other tests, and benchmarks/soak.py repeats
it many times under a CPU hog on every core."""

import pytest
from chaos import Chaos
from conftest import NO_REFERENCES, write_space


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["journal", "sqlite", "postgres"])
def test_chaos_three_workers_three_kills(backend, request, tmp_path, token_cache):
    storage = {"journal": f"journal:{tmp_path / 'chaos.log'}", "sqlite": f"sqlite:///{tmp_path / 'chaos.db'}"}.get(
        backend
    ) or request.getfixturevalue("postgres_url")
    space = write_space(
        tmp_path / "chaos.toml",
        model={"layers": 2, "d_model": 16, "seq_len": 32},
        search={**NO_REFERENCES, "enqueue_paper_maps": False, "max_reuse": 3},
        train={"checkpoint_every": 10, "eval_windows": 2},
    )
    chaos = Chaos(storage, tmp_path, space, token_cache, steps=16)  # the kills wait on events, not on training
    result = chaos.run()
    print(backend, result.marks)
    assert sorted(k.split(":")[1] for k in result.kills) == ["after", "before", "during"]
    assert not result.crashed_survivors, "\n".join(result.crashed_survivors)
    assert not result.lost_trials, (result.lost_trials, chaos.tails())
    assert not result.trained_twice, (result.trained_twice, chaos.tails())
    assert not result.left_running, (result.left_running, chaos.tails())
    assert not result.front_mismatch
    assert result.n_finished >= 8
