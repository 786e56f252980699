"""Checks shared by the multi-rank tests (bundled trainer and TRL under torchrun)."""
from __future__ import annotations


def assert_ranks_share_one_run(con, run_id: str, ranks: list[int]) -> None:
    """One run holds every rank's rows in every table, and no sample or group mixes two ranks."""
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    seen = {t: sorted(r for (r,) in con.execute(f"SELECT DISTINCT rank FROM {t} WHERE run_id=?", [run_id]).fetchall())
            for t in ("scalars", "tokens", "samples", "histograms")}
    assert all(v == ranks for v in seen.values()), seen
    for table, column in (("samples", "sample_id"), ("tokens", "sample_id"), ("samples", "group_id")):
        mixed = con.execute(f"SELECT count(*) FROM (SELECT step, {column} FROM {table} WHERE run_id=? "
                            "GROUP BY ALL HAVING count(DISTINCT rank) > 1)", [run_id]).fetchone()[0]
        assert mixed == 0, (table, column)
