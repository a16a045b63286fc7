"""Races between workers on the project's own tables, made to happen deterministically."""

import threading

import sqlalchemy as sa

from ilr_search.storage import open_store, parse_storage
from ilr_search.store import fronts_table

FRONT = [{"trial": 0, "reuse_map": [1, 1], "flops_ratio": 1.0, "val_ppl": 20.0, "val_bpb": 4.0, "params": 10},
         {"trial": 3, "reuse_map": [2, 1], "flops_ratio": 1.4, "val_ppl": 19.0, "val_bpb": 3.9, "params": 10}]


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
        conn_a.execute(fronts_table.insert(), [
            {"study": "s", "n_complete": 5, "position": i, "trial_number": p["trial"],
             "reuse_map": ",".join(map(str, p["reuse_map"])), "flops_ratio": p["flops_ratio"],
             "val_ppl": p["val_ppl"], "val_bpb": p["val_bpb"], "params": p["params"]} for i, p in enumerate(FRONT)])

        def save_b() -> None:
            try:
                store_b.save_front(5, FRONT)
            except BaseException as e:  # noqa: BLE001 - the test reports whatever escaped
                errors.append(e)

        b = threading.Thread(target=save_b)
        b.start()
        b.join(timeout=1.0)
        assert b.is_alive()  # B waits on A's uncommitted rows: the race is on
        tx.commit()
        b.join(timeout=30)
    assert not b.is_alive() and not errors, errors
    history = store_b.front_history()
    assert [p["trial"] for p in history[5]] == [0, 3]
    engine_a.dispose()
