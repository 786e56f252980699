"""`forksight train --probe-every N` on the bundled trainer: each probed step's rows and probe/*
scalars reach the run; the value after a completion's last token (EOS: the prefix has ended) is
that completion's own verified reward, exactly; probing leaves training bit-identical; the time
budget skips probes and says so once; a failing reward skips the step's probe with one warning."""
from __future__ import annotations

import logging

import pytest

from forksight.compose.local import LocalSink
from forksight.trainer.config import load_config
from forksight.trainer.loop import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")
BASE = dict(steps=3, max_new_tokens=6, probe_k=4, probe_positions="all", probe_samples=3)


def _train(tmp_path, name: str, **over):
    db = str(tmp_path / f"{name}.duckdb")
    result = train(load_config(preset="tiny-test", overrides={**BASE, "run": name, "db": db, **over}))
    from forksight.monitor.collector.store import Store

    return result, Store(db)


def test_each_probed_step_stores_rows_whose_last_value_is_the_completions_own_reward(tmp_path):
    result, store = _train(tmp_path, "probed", probe_every=1, probe_budget=100.0)
    with store:
        reader, run = store.reader, result.run_id
        assert reader.probe_steps(run) == [1, 2, 3]
        for step in (1, 2, 3):
            rows = reader.read_probes(run, step)
            rows = rows[rows.split.fillna("train") == "train"]     # step 3 also holds the final evaluation's
            samples = reader.read_samples(run, step).set_index("sample_id")
            assert rows.sample_id.nunique() == 3 and (rows.k == 4).all()
            for sample_id, group in rows.groupby("sample_id"):
                group = group.sort_values("pos")
                assert group.pos.tolist() == list(range(samples.loc[sample_id, "length"]))   # all positions
                last = group.iloc[-1]
                assert last.token_id == 0 or last.pos == 5   # it ended (EOS, id 0) or hit the length cap: the
                assert last.v_after == samples.loc[sample_id, "reward"] and last.se_after == 0   # value is its reward
                assert group.v_after.tolist()[:-1] == group.v_before.tolist()[1:]
        keys = set(reader.read_scalars(run).key)
        assert {"probe/seconds", "probe/skipped", "probe/completions", "probe/pivotal_per_completion"} <= keys


def test_probing_leaves_training_bit_identical(tmp_path):
    plain, s1 = _train(tmp_path, "plain")
    probed, s2 = _train(tmp_path, "with", probe_every=1, probe_budget=100.0)
    s1.close(), s2.close()
    same = {k: v for k, v in plain.final.items() if not k.startswith("time/")}
    assert same == {k: v for k, v in probed.final.items() if k in same}


def test_the_budget_skips_probes_past_its_share_and_says_so_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="forksight.probe"):
        result, store = _train(tmp_path, "budget", probe_every=1, probe_budget=1e-6)
    with store:
        skipped = store.reader.read_scalars(result.run_id, ["probe/skipped"])
        assert skipped.value.tolist() == [0.0, 1.0, 1.0]        # the first runs (its cost unknown), then none
        assert store.reader.probe_steps(result.run_id) == [1]
    warnings = [r for r in caplog.records if "value probes skipped" in r.getMessage()]
    assert len(warnings) == 1 and "budget" in warnings[0].getMessage()


def test_a_failing_reward_skips_the_probe_with_one_warning(tmp_path, tiny, caplog):
    from forksight.hooks.capture.step_probe import StepProber
    from forksight.hooks.metrics.value_probe import ProbeInput, ProbeSettings

    model, tok = tiny
    sink = LocalSink(str(tmp_path / "r.duckdb"), "reward-fails")
    prober = StepProber(sink, ProbeSettings(k=2, max_new_tokens=4), every=1, samples=1, budget=None)
    item = [ProbeInput(0, tok("1+1=").input_ids, [19, 0])]

    def broken(i, ids):
        raise RuntimeError("verifier down")
    with caplog.at_level(logging.WARNING, logger="forksight.probe"):
        assert prober.run(1, model, item, [], broken, eos_id=tok.eos_token_id) is None
        assert prober.run(2, model, item, [], broken, eos_id=tok.eos_token_id) is None
    messages = [r.getMessage() for r in caplog.records if "value probe of step" in r.getMessage()]
    assert len(messages) == 1 and "verifier down" in messages[0] and "training goes on" in messages[0]
    assert prober.run(3, model, item, [], lambda i, ids: 1.0, eos_id=tok.eos_token_id) is not None
    sink.flush()
    assert sink.reader.probe_steps(sink.run_id) == [3]
    sink.finish()


def test_undecided_groups_are_probed_first_and_a_search_stores_its_segments(tmp_path):
    # the readable preset's warm start, 0/1 rewards, groups of 2: pairs that differ, pairs all wrong or all right
    db = str(tmp_path / "readable.duckdb")
    result = train(load_config(preset="readable", overrides=dict(
        steps=1, run="undecided", db=db, progress=False, graded=False, group_size=2, probe_every=1, probe_samples=3, probe_k=2,
        probe_positions="search", probe_budget=100.0)))
    from forksight.monitor.collector.store import Store

    with Store(db) as store:
        reader, run = store.reader, result.run_id
        samples = reader.read_samples(run, 1)
        rows = reader.read_probes(run, 1)
        rows = rows[rows.split.fillna("train") == "train"]          # step 1 also ran the final evaluation
        scalars = reader.read_scalars(run)
    group = samples.sample_id // 2
    spread = samples.groupby(group).reward.nunique()
    mixed = set(samples.sample_id[group.map(spread) > 1])
    assert 0 < len(mixed) < len(samples)           # the check means something: both kinds exist
    probed = set(rows.sample_id)
    assert len(probed) == 3 and (probed <= mixed if len(mixed) >= 3 else mixed <= probed)
    for _, one in rows.groupby("sample_id"):       # bisection leaves tile each completion
        one = one.sort_values("pos")
        assert (one.pos + one.span).tolist()[:-1] == one.pos.tolist()[1:]
    cont = scalars[scalars.key == "probe/continuations"].value
    assert len(cont) == 1 and cont.iloc[0] > 0 and cont.iloc[0] % 2 == 0


def test_pick_takes_preferred_rows_first_then_fills_from_the_rest():
    from forksight.hooks.capture.step_probe import StepProber, undecided
    from forksight.hooks.metrics.value_probe import ProbeSettings

    assert undecided([1, 1, 0, 1, 0.5, 0.5], [0, 0, 1, 1, 2, 2]) == [2, 3]
    prober = StepProber(LocalSink.__new__(LocalSink), ProbeSettings(), every=1, samples=3)
    for step in range(20):
        assert set(prober.pick(10, step, prefer=[2, 3, 7, 8])) <= {2, 3, 7, 8}
        picked = prober.pick(10, step, prefer=[4])
        assert 4 in picked and len(picked) == 3
        assert prober.pick([1, 5], step, prefer=[5, 6]) == [1, 5]     # only eligible rows, never more than there are


def test_held_out_completions_are_probed_at_each_probed_evaluation(tmp_path, tiny):
    from forksight.trainer.probe import EVAL_SAMPLE_BASE
    from forksight.trainer.tasks import held_out, make_task

    result, store = _train(tmp_path, "heldout", steps=2, probe_every=2, eval_every=2, eval_problems=3,
                           eval_samples=2, probe_budget=100.0)
    with store:
        reader, run = store.reader, result.run_id
        assert reader.probe_steps(run) == [0, 1, 2]      # the base model's evaluation; training at 1 and 2
        scalars = reader.read_scalars(run)
        at0 = reader.read_probes(run, 0)
        at1, at2 = reader.read_probes(run, 1), reader.read_probes(run, 2)
        config = reader.run(run)["config"]
    assert set(at1.split.fillna("train")) == {"train"} and set(at2.split.fillna("train")) == {"train", "eval"}
    assert (at0.split == "eval").all() and (at0.sample_id >= EVAL_SAMPLE_BASE).all() and at0.sample_id.nunique() == 3
    keys = set(scalars.key)
    assert {"probe/eval/completions", "probe/eval/seconds", "probe/eval/continuations"} <= keys
    # the value after a held-out completion's last token is that completion's own verified reward
    task = make_task(config["task"], level=config["level"])
    problems = held_out(task, 3, config["seed"])
    _, tok = tiny                                    # the tiny model's tokenizer, as the run's
    for sample_id, rows in at0.groupby("sample_id"):
        rows = rows.sort_values("pos")
        problem = problems[(sample_id - EVAL_SAMPLE_BASE) // 2]
        text = tok.decode(rows.token_id.tolist(), skip_special_tokens=True)
        assert rows.v_after.iloc[-1] == task.verify(problem, text)[0] and rows.se_after.iloc[-1] == 0
