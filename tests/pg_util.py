"""A real PostgreSQL cluster for a test: initdb/pg_ctl in a temp dir, as the `postgres` user when the
tests run as root (PostgreSQL refuses root), on a free loopback port; stopped and removed at the end.

    from pg_util import PostgresCluster, postgres_or_skip
    with PostgresCluster() as pg:
        url = pg.database("lake1")      # postgresql+psycopg2://... of a new database
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from collector_util import free_port


def pg_bin() -> Path | None:
    """The directory of initdb/pg_ctl: Debian's newest /usr/lib/postgresql/N/bin, /usr/local/bin, or PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    for candidate in (*reversed(found), "/usr/local/bin/initdb", shutil.which("initdb") or ""):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate).parent
    return None


def postgres_or_skip() -> Path:
    """pg_bin(), or skip the test saying why (CI has PostgreSQL: Debian's `postgresql` package)."""
    import pytest

    where = pg_bin()
    if where is None:
        pytest.skip("PostgreSQL is not installed (no initdb in /usr/lib/postgresql/*/bin, /usr/local/bin or "
                    "PATH): apt-get install postgresql to run the multi-writer lake tests")
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: PostgreSQL cannot be started as root")
    return where


class PostgresCluster:
    """One throwaway cluster; start() runs initdb once, then pg_ctl start; stop() is pg_ctl stop -m fast."""

    def __init__(self, bin_dir: Path | None = None, user: str = "postgres"):
        self.bin = bin_dir or pg_bin()
        self.root = Path(tempfile.mkdtemp(prefix="forksight-pg-"))
        os.chmod(self.root, 0o755)
        self.data, self.port = self.root / "data", free_port()
        self.as_user = user if os.geteuid() == 0 else None
        if self.as_user:
            shutil.chown(self.root, user)

    def _run(self, *cmd: str) -> None:
        argv = [str(self.bin / cmd[0]), *cmd[1:]]
        if self.as_user:
            argv = ["runuser", "-u", self.as_user, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}\n"
                               f"{self.log()}")

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def start(self) -> "PostgresCluster":
        if not self.data.exists():
            self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "forksight", "--no-sync")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")
        return self

    def stop(self) -> None:
        """Stop the server (the data stays: start() again brings it back)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def processes(self) -> list[int]:
        """The postmaster's pid and its children's (every backend, the checkpointer, ...)."""
        top = int((self.data / "postmaster.pid").read_text().split()[0])
        pids = [top]
        for stat in glob.glob("/proc/[0-9]*/stat"):
            try:
                fields = Path(stat).read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == top:
                pids.append(int(stat.split("/")[2]))
        return pids

    def freeze(self) -> list[int]:
        """SIGSTOP every process of the cluster: a hung database (connections open, nothing answers)."""
        import signal

        pids = self.processes()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def thaw(self, pids: list[int]) -> None:
        """SIGCONT what freeze() stopped."""
        import signal

        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg2://forksight@127.0.0.1:{self.port}/{database}"

    def database(self, name: str) -> str:
        """Create database `name`; its SQLAlchemy URL."""
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="forksight", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return self.url(name)

    def close(self) -> None:
        try:
            if self.running():
                self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "PostgresCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
