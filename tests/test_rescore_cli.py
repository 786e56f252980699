"""`forksight rescore` (issue 48 items 2 and 7): a run trained without a reference set gets one from the stored
completions of a step, re-scored by its checkpoints — an HF folder told by its name (checkpoint-0: the
base model) and the bundled trainer's checkpoint.pt — through a real collector (--url) and a DuckDB file
(--db); the stored rows equal a float64 scoring of the same text by each checkpoint's weights. Bad input
exits 2 naming what was wrong, with nothing written."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from collector_util import InProcessCollector
from forksight.compose.cli import main
from forksight.hooks.capture.reference import set_from_rows
from forksight.monitor.collector.store import Store
from forksight.trainer.config import load_config
from forksight.trainer.loop import train
from test_reference import float64_scores


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_path):
    """A 4-step run without a reference set, its checkpoint.pt, and the base model as checkpoint-0."""
    out = tmp_path_factory.mktemp("rescore")
    result = train(load_config(preset="tiny-test", overrides=dict(
        db=str(out / "t.duckdb"), out_dir=str(out / "runs"), run="plain", steps=4, reference_every=0,
        token_groups=2)))
    shutil.copytree(tiny_model_path, out / "ckpts" / "checkpoint-0")
    return {"out": out, "db": str(out / "t.duckdb"), "pt": result.checkpoint, "ckpts": str(out / "ckpts")}


def _weights(model_path, pt=None):
    from forksight.trainer.model import load

    model, _ = load(model_path)
    if pt:
        model.load_state_dict(torch.load(pt, weights_only=False)["model"])
    return model.eval()


def test_from_step_through_a_collector_equals_float64_scores_of_each_checkpoint(trained, tmp_path, tiny_model_path,
                                                                               capsys):
    db = tmp_path / "copy.duckdb"
    shutil.copy(trained["db"], db)
    with InProcessCollector(db) as srv:
        code = main(["rescore", "--url", srv.url, "--run", "plain", "--from-step", "1", "--size", "5",
                     "--checkpoints", trained["ckpts"], str(trained["out"] / "runs" / "plain"), "--format", "json"])
        assert code == 0, capsys.readouterr().err
        out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        reader = srv.collector.store.reader
        assert reader.reference_steps("plain") == [0, 4]          # step 1's rows were sampled after 0 updates
        base_rows = reader.read_reference("plain", 0).to_dict("records")
        ref, base = set_from_rows(base_rows)
        stored_tokens = reader.read_tokens("plain", 1)
        rows = {s: reader.read_reference("plain", s).to_dict("records") for s in (0, 4)}
        scalars = reader.read_scalars("plain")
    assert out["base_step"] == 0 and out["completions"] == len(ref) == 5
    assert [c["step"] for c in out["checkpoints"]] == [0, 4]
    assert out["checkpoints"][0]["skipped"] == "the base (its stored statistics)"
    # the base is step 1's stored completions with their stored statistics
    by_pos = {(s, p): h for s, p, h in zip(stored_tokens.sample_id, stored_tokens.pos, stored_tokens.entropy)}
    firsts = sorted(stored_tokens.sample_id.unique())[:5]
    assert [len(c) for c in ref.completions] == [int((stored_tokens.sample_id == s).sum()) for s in firsts]
    for i, s in enumerate(firsts):
        assert base.entropy[i] == pytest.approx([by_pos[(s, p)] for p in range(len(ref.completions[i]))], abs=1e-6)
    # the base's stored statistics are the base model's own scoring of that text (it sampled step 1)
    want0 = float64_scores(_weights(tiny_model_path), ref, 1.0)
    for i, h in enumerate(base.entropy):
        assert h == pytest.approx(want0[i]["entropy"], abs=1e-4)
    for step, model in ((4, _weights(tiny_model_path, trained["pt"])),):
        want = float64_scores(model, ref, 1.0)
        assert len(rows[step]) == sum(map(len, ref.completions))
        for r in rows[step]:
            assert r["entropy"] == pytest.approx(want[r["sample_id"]]["entropy"][r["pos"]], abs=1e-5)
            assert r["logp"] == pytest.approx(want[r["sample_id"]]["logp"][r["pos"]], abs=1e-5)
    at = {(s, k): v for s, k, v in zip(scalars.step, scalars.key, scalars.value)}
    assert at[(0, "ref/fork_overlap")] == 1.0 and at[(4, "ref/fork_overlap")] == out["checkpoints"][1]["ref/fork_overlap"]


@pytest.mark.parametrize("args, says", [
    (["--checkpoints", "{ckpts}"], "has no reference set: give --from-step S"),
    (["--from-step", "1", "--checkpoints", "{empty}"], "holds no checkpoint"),
    (["--from-step", "1", "--checkpoints", "{model}"], "cannot tell the training step"),
    (["--from-step", "1", "--checkpoints", "{small}"], "has a vocabulary of 16"),
    (["--from-step", "1", "--checkpoints", "{ckpts}/checkpoint-0", "{ckpts}/checkpoint-0"], "more than one checkpoint"),
    (["--from-step", "99", "--checkpoints", "{ckpts}"], "no stored completion with token ids at step 99"),
    (["--run", "nope", "--from-step", "1", "--checkpoints", "{ckpts}"], "no run 'nope'"),
])
def test_bad_input_exits_2_names_it_and_writes_nothing(trained, tmp_path, tiny_model_path, capsys, args, says):
    small = tmp_path / "small" / "checkpoint-3"
    shutil.copytree(tiny_model_path, small)
    config = json.loads((small / "config.json").read_text())
    (small / "config.json").write_text(json.dumps({**config, "vocab_size": 16}))
    (tmp_path / "empty").mkdir()
    paths = {"ckpts": trained["ckpts"], "empty": str(tmp_path / "empty"), "model": str(tiny_model_path),
             "small": str(small)}
    given = [a.format(**paths) for a in args]
    if "--run" not in given:
        given = ["--run", "plain", *given]
    with Store(trained["db"], verify=False) as store:
        before = store.reader.row_counts("plain")
    assert main(["rescore", "--db", trained["db"], *given]) == 2
    assert says in capsys.readouterr().err
    with Store(trained["db"], verify=False) as store:
        assert store.reader.row_counts("plain") == before and before["reference"] == 0


def test_a_set_is_never_replaced_and_a_scored_step_is_not_scored_twice(trained, tmp_path, capsys):
    db = str(tmp_path / "t.duckdb")
    shutil.copy(trained["db"], db)
    assert main(["rescore", "--db", db, "--run", "plain", "--from-step", "2", "--size", "2",
                 "--checkpoints", f"{trained['ckpts']}/checkpoint-0"]) == 0
    with Store(db, verify=False) as store:
        counts = store.reader.row_counts("plain")
    capsys.readouterr()
    assert main(["rescore", "--db", db, "--run", "plain", "--from-step", "2",
                 "--checkpoints", f"{trained['ckpts']}/checkpoint-0"]) == 2
    assert "already has a reference set (its base at step 1)" in capsys.readouterr().err
    assert main(["rescore", "--db", db, "--run", "plain", "--checkpoints", trained["ckpts"]]) == 0
    assert "step 0: already scored" in capsys.readouterr().out
    with Store(db, verify=False) as store:
        assert store.reader.row_counts("plain") == counts
