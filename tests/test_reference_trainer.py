"""The bundled trainer's reference set (issue 48 item 1), real short runs into a real DuckDB file: the set is
sampled once at step 0 from its own random stream (the trained trajectory is the same without it),
re-scored every N steps, the stored rows equal a float64 scoring of the same text by the saved final
policy, and a resumed run keeps its set and base."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from forksight.hooks.capture.reference import set_from_rows
from forksight.monitor.collector.store import Store
from forksight.trainer.config import load_config
from forksight.trainer.loop import train
from test_reference import float64_scores


def _run(tmp_path, **over):
    tmp_path.mkdir(parents=True, exist_ok=True)
    values = dict(db=str(tmp_path / "t.duckdb"), out_dir=str(tmp_path / "runs"), run="ref", steps=4,
                  reference_every=2, reference_size=6, reference_budget=100.0)
    values.update(over)
    return train(load_config(preset="tiny-test", overrides=values))


def _rows(reader, run, step) -> list[dict]:
    return reader.read_reference(run, step).to_dict("records")


def test_the_set_is_rescored_every_n_steps_and_leaves_the_trajectory_alone(tmp_path, tiny_model_path):
    with_ref = _run(tmp_path / "a")
    without = _run(tmp_path / "b", reference_every=0)
    timeless = lambda final: {k: v for k, v in final.items() if not k.startswith("time/")}  # noqa: E731
    assert timeless(with_ref.final) == timeless(without.final)     # the same trained steps, value for value
    with Store(str(tmp_path / "a" / "t.duckdb")) as store:
        reader = store.reader
        assert reader.reference_steps("ref") == [0, 2, 4]
        ref, _ = set_from_rows(_rows(reader, "ref", 0))
        assert len(ref) == 6 and all(ref.completions)
        scalars = reader.read_scalars("ref")
        at = {(s, k): v for s, k, v in zip(scalars.step, scalars.key, scalars.value)}
        assert at[(0, "ref/fork_overlap")] == 1.0 and at[(0, "ref/dh/mean")] == 0.0
        assert at[(4, "ref/tokens")] == sum(len(c) for c in ref.completions)
        last = _rows(reader, "ref", 4)
    # the stored step-4 rows are the final policy's scoring of the same text
    from forksight.trainer.model import load

    model, _ = load(tiny_model_path)
    model.load_state_dict(torch.load(with_ref.checkpoint, weights_only=False)["model"])
    want = float64_scores(model.eval(), ref, 1.0)
    assert [(r["sample_id"], r["token_id"]) for r in last] == \
        [(i, t) for i, c in enumerate(ref.completions) for t in c]
    for r in last:
        assert r["entropy"] == pytest.approx(want[r["sample_id"]]["entropy"][r["pos"]], abs=1e-5)
        assert r["logp"] == pytest.approx(want[r["sample_id"]]["logp"][r["pos"]], abs=1e-5)
    with Store(str(tmp_path / "b" / "t.duckdb")) as store:
        assert store.reader.reference_steps("ref") == []


def test_the_stored_deciles_and_overlap_equal_numpy_on_the_stored_rows(tmp_path):
    _run(tmp_path, reference_every=2, fork_rule="top:0.25")
    with Store(str(tmp_path / "t.duckdb")) as store:
        reader = store.reader
        base = reader.read_reference("ref", 0)
        base = base[base.pos >= 0].sort_values(["sample_id", "pos"])
        scalars = reader.read_scalars("ref")
        for step in (2, 4):
            now = reader.read_reference("ref", step).sort_values(["sample_id", "pos"])
            at = {k: v for s, k, v in zip(scalars.step, scalars.key, scalars.value) if s == step}
            hb, hn = base.entropy.to_numpy(np.float64), now.entropy.to_numpy(np.float64)
            fb, fn = base.fork.to_numpy(bool), now.fork.to_numpy(bool)
            # the stored flags are the rule's: the top 25% of the set's H at that step
            assert np.array_equal(fn, hn >= np.quantile(hn, 0.75))
            assert at["ref/fork_overlap"] == pytest.approx((fb & fn).sum() / fb.sum())
            assert at["ref/fork_jaccard"] == pytest.approx((fb & fn).sum() / (fb | fn).sum())
            ranks = np.empty(len(hb), dtype=int)
            ranks[np.lexsort((np.arange(len(hb)), hb))] = np.arange(len(hb))      # by H, ties by position
            for d in range(10):
                inside = ranks * 10 // len(hb) == d
                assert at[f"ref/dh/d{d + 1}"] == pytest.approx(np.abs(hn - hb)[inside].mean(), abs=1e-6)


def test_a_resumed_run_keeps_its_set_and_its_base(tmp_path):
    _run(tmp_path, steps=2)
    _run(tmp_path, steps=4, resume=True)
    with Store(str(tmp_path / "t.duckdb")) as store:
        reader = store.reader
        assert reader.reference_steps("ref") == [0, 2, 4]
        base = _rows(reader, "ref", 0)
        assert len(base) == len({(r["sample_id"], r["pos"]) for r in base})        # the base stored once
        ref, _ = set_from_rows(base)
        assert [(r["sample_id"], r["token_id"]) for r in _rows(reader, "ref", 4)] == \
            [(i, t) for i, c in enumerate(ref.completions) for t in c]
        scalars = reader.read_scalars("ref")
        overlap = dict(zip(zip(scalars.step, scalars.key), scalars.value))
        assert overlap[(0, "ref/fork_overlap")] == 1.0 and 0.0 <= overlap[(4, "ref/fork_overlap")] <= 1.0
