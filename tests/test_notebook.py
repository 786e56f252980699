"""A run in a notebook (issue 47, item 3): `forksight.show`, `forksight.show_tokens` and
`forksight.load` on a real `forksight train` run, read from its DuckDB file and from a real
collector (uvicorn on 127.0.0.1, a bearer token) — the same numbers both ways, each checked against
a direct SQL read of the file — and a real notebook executed headless (nbclient, an IPython kernel)
whose outputs hold the plotly figures and the coloured completions. Bad input: a clear error."""
from __future__ import annotations

import duckdb
import numpy as np
import pytest

import forksight
from collector_util import InProcessCollector

pytestmark = pytest.mark.slow
RUN = "nb"


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    from forksight.trainer.config import load_config
    from forksight.trainer.loop import train

    db = str(tmp_path_factory.mktemp("notebook") / "runs.duckdb")
    train(load_config(preset="tiny-test", overrides=dict(task="collapse", lr=0.03, max_new_tokens=6, steps=8,
                                                          run=RUN, db=db, progress=False)))
    return db


def _sql(db: str, query: str, *params):
    with duckdb.connect(db, read_only=True) as conn:
        return conn.execute(query, list(params)).df()


def _entropy_trace(figures) -> tuple[list, list]:
    trace = next(t for t in figures["entropy"].data if t.meta and t.meta.get("key") == "entropy/mean"
                 and t.meta.get("role") == "raw")
    return list(trace.x), list(trace.y)


def test_load_returns_the_stored_scalars_tokens_samples_and_alerts(stored):
    tables = forksight.load(RUN, db=stored, token_steps=3)
    mean = _sql(stored, "SELECT step, avg(value) AS v FROM scalars WHERE run_id = ? AND key = 'entropy/mean' "
                        "GROUP BY step ORDER BY step", RUN)
    got = tables.scalars[tables.scalars.key == "entropy/mean"].sort_values("step")
    assert got.step.tolist() == mean.step.tolist()
    np.testing.assert_allclose(got.value.to_numpy(), mean.v.to_numpy(), rtol=1e-12)
    steps = _sql(stored, "SELECT DISTINCT step FROM tokens WHERE run_id = ? ORDER BY step", RUN).step.tolist()
    assert tables.token_steps == [steps[0], steps[len(steps) // 2], steps[-1]] or \
        (len(tables.token_steps) == 3 and tables.token_steps[0] == steps[0] and tables.token_steps[-1] == steps[-1])
    rows = _sql(stored, "SELECT step, sample_id, pos, token_id, entropy FROM tokens WHERE run_id = ? AND step IN "
                        f"({','.join(map(str, tables.token_steps))}) ORDER BY step, sample_id, pos", RUN)
    mine = tables.tokens.sort_values(["step", "sample_id", "pos"])
    assert mine.token_id.tolist() == rows.token_id.tolist()
    np.testing.assert_allclose(mine.entropy.to_numpy(float), rows.entropy.to_numpy(float), rtol=1e-12)
    assert len(tables.alerts) == len(_sql(stored, "SELECT * FROM alerts WHERE run_id = ?", RUN))
    assert tables.wide().loc[steps[-1], "entropy/mean"] == pytest.approx(mean.v.iloc[-1])
    assert tables.arrow()["tokens"].num_rows == len(rows)
    assert tables.config.get("task") == "collapse"
    # the reference set kept at step 0 (the bundled trainer keeps one by default), every stored row
    ref = _sql(stored, "SELECT step, sample_id, pos, token_id FROM reference WHERE run_id = ? "
                       "ORDER BY step, sample_id, pos", RUN)
    cols = ["step", "sample_id", "pos", "token_id"]
    assert len(ref) > 0 and tables.reference.sort_values(cols[:3])[cols].values.tolist() == ref.values.tolist()


def test_show_draws_the_run_pages_figures_from_the_stored_numbers(stored):
    figures = forksight.show(RUN, db=stored)
    assert {"entropy", "heatmap", "passk", "signals"} <= set(figures)
    x, y = _entropy_trace(figures)
    mean = _sql(stored, "SELECT step, avg(value) AS v FROM scalars WHERE run_id = ? AND key = 'entropy/mean' "
                        "GROUP BY step ORDER BY step", RUN)
    assert x == mean.step.tolist()
    np.testing.assert_allclose(y, mean.v.to_numpy(), rtol=1e-6)
    assert figures.verdict


def test_a_collector_gives_the_same_figures_and_tables_with_its_token(stored):
    by_file = forksight.show(RUN, db=stored)
    file_tables = forksight.load(RUN, db=stored, token_steps=2)
    file_tokens = forksight.show_tokens(RUN, db=stored)
    with InProcessCollector(stored, token="s3cret") as srv:
        with pytest.raises(PermissionError, match="token"):
            forksight.load(RUN, url=srv.url)
        by_url = forksight.show(RUN, url=srv.url, token="s3cret")
        url_tables = forksight.load(RUN, url=srv.url, token="s3cret", token_steps=2)
        url_tokens = forksight.show_tokens(RUN, url=srv.url, token="s3cret")
        with pytest.raises(KeyError, match="no run 'nope'"):
            forksight.show("nope", url=srv.url, token="s3cret")
    assert set(by_url) == set(by_file)
    assert _entropy_trace(by_url) == _entropy_trace(by_file)
    cols = ["step", "sample_id", "pos", "token_id"]
    assert url_tables.tokens[cols].values.tolist() == file_tables.tokens.sort_values(cols[:3])[cols].values.tolist()
    assert url_tokens.step == file_tokens.step and url_tokens.html == file_tokens.html
    assert url_tables.reference[cols].values.tolist() == \
        file_tables.reference.sort_values(cols[:3])[cols].values.tolist() and len(url_tables.reference)


def test_a_notebook_executed_headless_shows_the_figures_and_the_tokens(stored, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import forksight"),
                nbformat.v4.new_code_cell(f"forksight.show({RUN!r}, db={stored!r})"),
                nbformat.v4.new_code_cell(f"forksight.show_tokens({RUN!r}, db={stored!r})"),
                nbformat.v4.new_code_cell(f"t = forksight.load({RUN!r}, db={stored!r})\nprint(len(t.tokens), 'token rows')")]
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for cell in nb.cells for o in cell.get("outputs", [])]
    errors = [o for o in outputs if o.output_type == "error"]
    assert not errors, errors
    plotly = [o for o in nb.cells[1].outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert len(plotly) >= 4                                     # each figure displayed inline
    keys = {t.get("meta", {}).get("key") for o in plotly for t in o.data["application/vnd.plotly.v1+json"]["data"]}
    assert "entropy/mean" in keys
    html = "".join(o.get("data", {}).get("text/html", "") for o in nb.cells[2].outputs)
    assert "class='tok" in html and "<style>" in html
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in nb.cells[2].outputs)
    assert "token rows" in "".join(o.get("text", "") for o in nb.cells[3].outputs)


@pytest.mark.parametrize("kwargs, error, says", [
    ({}, ValueError, "give db= (a DuckDB file) or url="),
    ({"db": "x.duckdb", "url": "http://127.0.0.1:1"}, ValueError, "one of the two"),
    ({"db": "/nonexistent/runs.duckdb"}, FileNotFoundError, "no DuckDB file at /nonexistent/runs.duckdb"),
    ({"url": "http://127.0.0.1:1"}, ConnectionError, "no collector answers at http://127.0.0.1:1"),
])
def test_where_to_read_is_checked_with_a_clear_error(kwargs, error, says):
    with pytest.raises(error, match=says.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        forksight.load(RUN, **kwargs)


def test_an_unknown_run_or_step_is_named_and_no_file_is_made(stored, tmp_path):
    with pytest.raises(KeyError, match=f"no run 'nope' there; runs: .*{RUN}"):
        forksight.show("nope", db=stored)
    steps = _sql(stored, "SELECT DISTINCT step FROM tokens WHERE run_id = ? ORDER BY step", RUN).step.tolist()
    with pytest.raises(ValueError, match=f"no token rows at step 999; the nearest stored is {steps[-1]}"):
        forksight.show_tokens(RUN, 999, db=stored)
    with pytest.raises(ValueError, match=r"no token rows at step\(s\) \[999\]"):
        forksight.load(RUN, db=stored, token_steps=[steps[0], 999])
    missing = tmp_path / "typo.duckdb"
    with pytest.raises(FileNotFoundError):
        forksight.load(RUN, db=str(missing))
    assert not missing.exists()
