"""Races between workers on the project's own tables, made to happen deterministically."""

import json
import subprocess
import sys
import threading

import optuna
import pytest
import sqlalchemy as sa
from helpers import HANG_SECONDS, wait_until
from optuna.trial import TrialState

from ilr_search.storage import open_storage, open_store, parse_storage
from ilr_search.storage.sql_store import fronts_table

FRONT = [
    {"trial": 0, "reuse_map": [1, 1], "flops_ratio": 1.0, "val_ppl": 20.0, "val_bpb": 4.0, "params": 10},
    {"trial": 3, "reuse_map": [2, 1], "flops_ratio": 1.4, "val_ppl": 19.0, "val_bpb": 3.9, "params": 10},
]


def test_two_workers_saving_the_same_front_at_once_on_postgres(postgres_url):
    """Worker A has deleted and inserted the front of count 5 but not committed; worker B's save_front of
    the same count blocks on A's rows, then meets A's committed rows (IntegrityError before the fix)."""
    spec = parse_storage(postgres_url)
    store_b = open_store(spec, "s")  # creates the tables
    engine_a = sa.create_engine(spec.url)
    errors: list[BaseException] = []
    with engine_a.connect() as conn_a:
        tx = conn_a.begin()
        conn_a.execute(fronts_table.delete().where(fronts_table.c.study == "s", fronts_table.c.n_complete == 5))
        conn_a.execute(
            fronts_table.insert(),
            [
                {
                    "study": "s",
                    "n_complete": 5,
                    "position": i,
                    "trial_number": p["trial"],
                    "reuse_map": ",".join(map(str, p["reuse_map"])),
                    "flops_ratio": p["flops_ratio"],
                    "val_ppl": p["val_ppl"],
                    "val_bpb": p["val_bpb"],
                    "params": p["params"],
                }
                for i, p in enumerate(FRONT)
            ],
        )

        def save_b() -> None:
            try:
                store_b.save_front(5, FRONT)
            except BaseException as e:  # noqa: BLE001 - the test reports whatever escaped
                errors.append(e)

        b = threading.Thread(target=save_b)
        b.start()
        # the event: B's session waits on a lock (A's uncommitted rows), seen by the server: the race is on
        watching = sa.create_engine(spec.url, isolation_level="AUTOCOMMIT")
        with watching.connect() as watcher:
            wait_until(
                lambda: watcher.execute(sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted")).scalar() > 0,
                "worker B waiting on worker A's rows",
            )
        watching.dispose()
        assert b.is_alive()
        tx.commit()
        b.join(timeout=HANG_SECONDS)
    assert not b.is_alive() and not errors, errors
    history = store_b.front_history()
    assert [p.trial for p in history[5]] == [0, 3]
    engine_a.dispose()


POP_ALL = """
import json, sys
import optuna
from ilr_search.storage import open_storage, parse_storage
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name="s", storage=open_storage(parse_storage(sys.argv[1])))
print("ready", flush=True)
sys.stdin.readline()  # start together
popped = []
while (trial_id := study._pop_waiting_trial_id()) is not None:
    popped.append(trial_id)
print(json.dumps(popped))
"""


@pytest.mark.slow
def test_processes_popping_queued_trials_from_sqlite_never_share_one(tmp_path):
    """Optuna guards the pop of an enqueued trial with SELECT ... FOR UPDATE, which SQLite ignores: before the
    fix, 4 processes popping 60 queued trials popped 6-14 of them twice (3 runs of 3), and two workers trained
    one trial at once under one claim."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    study = optuna.create_study(study_name="s", storage=open_storage(parse_storage(url)))
    for x in range(60):
        study.enqueue_trial({"x": x})
    workers = [
        subprocess.Popen([sys.executable, "-c", POP_ALL, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for w in workers:  # every worker has imported and opened the study before any starts popping
        assert w.stdout.readline().strip() == "ready"
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    outputs = [w.communicate(timeout=HANG_SECONDS)[0] for w in workers]
    popped = [trial_id for out in outputs for trial_id in json.loads(out)]
    assert sum(bool(json.loads(out)) for out in outputs) >= 2  # the pops raced: more than one worker got trials
    assert sorted(popped) == sorted(t._trial_id for t in study.get_trials())
    assert all(t.state == TrialState.RUNNING for t in study.get_trials())


def test_a_journal_writer_killed_holding_the_lock_leaves_it_free(tmp_path):
    """kill -9 of a worker in the middle of a journal write frees the journal's lock at once. (Optuna's lock files
    outlived their holder by a 30 s grace period, in which no worker could write a heartbeat, so live trials then
    looked stale and were failed and trained again: the chaos scenario on the journal saw it.)"""
    from ilr_search.storage.optuna_storage import JournalFlock

    journal = str(tmp_path / "j.log")
    optuna.create_study(study_name="s", storage=open_storage(parse_storage(f"journal:{journal}")))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\n"
                "from ilr_search.storage.optuna_storage import JournalFlock\n"
                f"assert JournalFlock({journal!r}).acquire()\n"
                "print('locked', flush=True)\n"
                "sys.stdin.readline()\n"
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert not JournalFlock(journal).acquire(blocking=False)  # held by the other process
    finally:
        holder.kill()
        holder.wait()
    lock = JournalFlock(journal)
    assert lock.acquire(blocking=False)  # free the moment its holder died
    lock.release()
    study = optuna.load_study(study_name="s", storage=open_storage(parse_storage(f"journal:{journal}")))
    study.enqueue_trial({"x": 1})  # and the journal takes writes
    assert len(study.trials) == 1
