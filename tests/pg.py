"""A PostgreSQL server for tests: the one .ci/run started (ILR_SEARCH_TEST_POSTGRES), or a throwaway cluster
started here on 127.0.0.1; tests skip with the reason only when neither is possible (never on CI)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid

import pytest


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def start_cluster() -> tuple[str, callable]:
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins:
        raise RuntimeError("no PostgreSQL server binaries (apt-get install postgresql)")
    pgbin = bins[-1]
    root = tempfile.mkdtemp(prefix="ilr-pg-test-")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = os.path.join(root, "data")
    subprocess.run(
        _as_postgres([f"{pgbin}/initdb", "-D", data, "-A", "trust", "-U", "postgres"]), check=True, capture_output=True
    )
    subprocess.run(
        _as_postgres(
            [
                f"{pgbin}/pg_ctl",
                "-D",
                data,
                "-l",
                os.path.join(root, "log"),
                "-w",
                "-o",
                f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c max_connections=200 -c fsync=off",
                "start",
            ]
        ),
        check=True,
        capture_output=True,
    )

    def stop() -> None:
        subprocess.run(_as_postgres([f"{pgbin}/pg_ctl", "-D", data, "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)

    return f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres", stop


@pytest.fixture(scope="session")
def postgres_server():
    url = os.environ.get("ILR_SEARCH_TEST_POSTGRES")
    stop = None
    if not url:
        try:
            url, stop = start_cluster()
        except Exception as e:
            if os.environ.get("CI"):
                pytest.fail(f"CI must provide PostgreSQL, and none could be started: {e}")
            pytest.skip(f"no PostgreSQL server could be started here: {e}")
    yield url
    if stop:
        stop()


@pytest.fixture
def postgres_url(postgres_server):
    """A fresh, empty database on the test server."""
    import psycopg

    name = f"ilr_{uuid.uuid4().hex[:12]}"
    admin = postgres_server.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield postgres_server.rsplit("/", 1)[0] + f"/{name}"
