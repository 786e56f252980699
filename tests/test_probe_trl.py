"""Value probes on a real GRPOTrainer (tiny offline model, CPU) through `forksight.trl.attach(...,
probe_every=1)`, then `forksight probe` offline on the run TRL stored (--db, and --url against a
real collector). TRL's reward here depends only on the parity of the first completion token, so
every value of a prefix holding a first token is determined: the probe must give it exactly."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import forksight.trl
from collector_util import InProcessCollector
from forksight.compose.cli import main
from forksight.monitor.collector.store import Store

REPO = Path(__file__).resolve().parents[1]
REWARDS = REPO / "tests" / "probe_rewards.py"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def even_first_token(completions, completion_ids, **kwargs):
    return [1.0 if ids and ids[0] % 2 == 0 else 0.0 for ids in completion_ids]


@pytest.fixture(scope="module")
def trl_run(tiny_model_path, tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from forksight.trainer.model import load

    tmp = tmp_path_factory.mktemp("probe_trl")
    model, tokenizer = load(tiny_model_path)
    config = GRPOConfig(output_dir=str(tmp / "out"), report_to="none", use_cpu=True, bf16=False, seed=0,
                        per_device_train_batch_size=8, num_generations=4, max_completion_length=6,
                        learning_rate=5e-3, max_steps=2, logging_steps=1, save_strategy="no", disable_tqdm=True)
    data = Dataset.from_list([{"prompt": f"Q: {10 + i}+{20 + i}= A:", "answer": str(30 + 2 * i)} for i in range(64)])
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=data,
                          processing_class=tokenizer)
    db = str(tmp / "trl.duckdb")
    callback = forksight.trl.attach(trainer, db=db, run="trl-probed", sample=2, probe_every=1, probe_samples=3,
                                    probe_k=6, probe_positions="all", probe_budget=100.0)
    trainer.train()
    callback.detach()
    return db, "trl-probed", str(tiny_model_path)


def test_trl_probes_each_step_with_the_trainers_reward_exactly_where_it_is_determined(trl_run):
    db, run, _ = trl_run
    with Store(db) as store:
        reader = store.reader
        assert reader.probe_steps(run) == [1, 2]
        for step in (1, 2):
            rows = reader.read_probes(run, step)
            assert rows["sample_id"].nunique() == 3 and (rows["k"] == 6).all()
            for _, group in rows.groupby("sample_id"):
                first = group[group.pos == 0].iloc[0]
                own = 1.0 if first.token_id % 2 == 0 else 0.0
                assert first.v_after == own and first.se_after == 0.0
                later = group[group.pos > 0]
                assert (later.v_before == own).all() and (later.v_after == own).all() and (later.delta == 0).all()
                assert 0.0 <= first.v_before <= 1.0
        scalars = reader.read_scalars(run)
        keys = set(scalars.key)
        assert {"probe/seconds", "probe/skipped", "probe/completions", "probe/pivotal_per_completion"} <= keys
        assert scalars[scalars.key == "probe/skipped"].value.tolist() == [0.0, 0.0]


def test_the_offline_probe_of_a_trl_stored_run_writes_rows_from_the_stored_token_ids(trl_run, tmp_path, capsys):
    db, run, model = trl_run
    with Store(db) as store:
        stored = store.reader.read_tokens(run, 2)
        before = store.reader.row_counts(run)["probes"]
    code = main(["probe", "--db", db, "--run", run, "--step", "2", "--model", model, "--reward",
                 f"{REWARDS}:starts_with_digit", "--samples", "2", "--positions", "all", "--k", "4"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["completions"] == 2 and summary["positions"] > 0
    with Store(db) as store:
        assert store.reader.row_counts(run)["probes"] == before + summary["positions"]
        rows = store.reader.read_probes(run, 2)
    new = rows[rows.k == 4]                      # the offline probe's (training probed with k=6)
    assert set(new.sample_id) <= set(stored.sample_id)
    keyed = stored.set_index(["sample_id", "pos"]).token_id
    for _, row in new.iterrows():               # the very ids the run stored, never re-tokenised text
        assert row.token_id == keyed[(row.sample_id, row.pos)]
    for _, group in new.groupby("sample_id"):
        group = group.sort_values("pos")
        assert group.v_after.tolist()[:-1] == group.v_before.tolist()[1:]


def test_the_offline_search_stores_every_estimated_prefix_and_counts_its_continuations(trl_run, capsys):
    db, run, model = trl_run
    with Store(db) as store:
        before = store.reader.row_counts(run)["probes"]
    code = main(["probe", "--db", db, "--run", run, "--step", "2", "--model", model, "--reward",
                 f"{REWARDS}:starts_with_digit", "--samples", "2", "--positions", "search", "--k", "3"])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with Store(db) as store:
        rows = store.reader.read_probes(run, 2)
        assert store.reader.row_counts(run)["probes"] == before + summary["positions"] + summary["segments"]
    new = rows[rows.k == 3]
    assert new.sample_id.nunique() == 2
    for _, group in new.groupby("sample_id"):   # the leaves tile the completion: each row's end is the next's start
        group = group.sort_values("pos")
        ends = (group.pos + group.span.fillna(1)).tolist()
        assert group.pos.tolist()[0] == 0 and ends[:-1] == group.pos.tolist()[1:]
        assert group.v_after.tolist()[:-1] == group.v_before.tolist()[1:]
        wide = group[group.span > 1]           # not searched inside: its ends closer than the pivotal delta
        assert ((wide.v_after - wide.v_before).abs() < 0.2).all() and wide.entropy.isna().all()
    assert summary["continuations"] > 0 and summary["continuations"] % 3 == 0   # k per sampled value


def test_the_offline_probe_reads_and_writes_through_a_collector(trl_run):
    db, run, model = trl_run
    with InProcessCollector(db) as srv:
        done = subprocess.run([sys.executable, "-m", "forksight", "probe", "--url", srv.url, "--run", run,
                               "--step", "1", "--model", model, "--reward", f"{REWARDS}:starts_with_digit",
                               "--samples", "1", "--k", "2"], capture_output=True, text=True, timeout=300, cwd=REPO)
        assert done.returncode == 0, done.stderr
        assert "probing 1 completion(s) of step 1" in done.stderr          # the progress bar
        import httpx

        rows = httpx.get(f"{srv.url}/api/runs/{run}/probes", params={"step": 1}).json()
        assert any(r["k"] == 2 for r in rows)


@pytest.mark.parametrize("reward, says", [
    ("no_such_module_xyz:f", "importing no_such_module_xyz failed"),
    (f"{REWARDS}:missing", "has no function 'missing'"),
    (f"{REWARDS}:raises", "raised ZeroDivisionError"),
    (f"{REWARDS}:not_a_number", "returned 'high' (str)"),
    (f"{REWARDS}:nan_reward", "finite number"),
])
def test_a_bad_reward_exits_non_zero_naming_it_and_writes_nothing(trl_run, capsys, reward, says):
    db, run, model = trl_run
    with Store(db) as store:
        before = store.reader.row_counts(run)
    code = main(["probe", "--db", db, "--run", run, "--step", "1", "--model", model, "--reward", reward,
                 "--samples", "1", "--k", "2"])
    err = capsys.readouterr().err
    assert code == 2 and says in err and "Traceback" not in err
    with Store(db) as store:
        assert store.reader.row_counts(run) == before


@pytest.mark.parametrize("args, says", [
    (["--k", "0"], "k (continuations per value) must be a whole number >= 1"),
    (["--run", "nope"], "no run 'nope'"),
    (["--step", "99"], "no stored completion with token ids at step 99"),
    (["--positions", "many"], "positions must be 'auto', 'forks', 'all', 'search' or a number"),
    (["--positions", "search", "--pivot-delta", "0"], "the pivotal delta must be between 0 and 1"),
    (["--positions", "search", "--pivot-delta", "1"], "the pivotal delta must be between 0 and 1"),
    (["--search-above", "-1"], "search_above must be a whole number of tokens >= 0"),
])
def test_bad_arguments_exit_non_zero_with_a_clear_message(trl_run, capsys, args, says):
    db, run, model = trl_run
    base = {"--db": db, "--run": run, "--step": "1", "--model": model, "--reward": f"{REWARDS}:starts_with_digit"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    code = main(["probe", *[x for kv in base.items() for x in kv]])
    err = capsys.readouterr().err
    assert code == 2 and says in err, err


def test_a_model_whose_vocabulary_does_not_fit_the_stored_ids_is_refused(tmp_path, tiny_model_path, capsys):
    from forksight.compose.local import LocalSink

    db = str(tmp_path / "other.duckdb")
    sink = LocalSink(db, "foreign")
    sink.log_samples(1, [{"sample_id": 0, "prompt": "Q: 1+1= A:", "completion": "x", "reward": 0.0}])
    sink.log_tokens(1, {"sample_id": [0, 0], "pos": [0, 1], "token_id": [7, 90_000], "token": ["a", "b"]})
    sink.finish()
    code = main(["probe", "--db", db, "--run", "foreign", "--step", "1", "--model", str(tiny_model_path),
                 "--reward", f"{REWARDS}:starts_with_digit"])
    err = capsys.readouterr().err
    assert code == 2 and ("does not match the run's" in err or "outside this model's vocabulary" in err), err


def test_a_verl_runs_completion_cap_is_its_max_response_length(tmp_path, tiny_model_path, capsys):
    """verl's integration stores the cap as max_response_length: the continuations run to it, not to
    the longest stored completion (two tokens here), which made every value come out low."""
    import json

    from forksight.compose.local import LocalSink

    db = str(tmp_path / "verl.duckdb")
    sink = LocalSink(db, "verl-run", config={"verl": "0.9.1", "max_response_length": 40, "temperature": 1.0})
    sink.log_samples(1, [{"sample_id": 0, "prompt": "Q: 1+1= A:", "completion": "x", "reward": 0.0}])
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_model_path))
    sink.log_tokens(1, {"sample_id": [0, 0], "pos": [0, 1], "token_id": [7, 9], "token": [tok.decode([7]), tok.decode([9])]})
    sink.finish()
    code = main(["probe", "--db", db, "--run", "verl-run", "--step", "1", "--model", str(tiny_model_path),
                 "--reward", f"{REWARDS}:starts_with_digit", "--k", "2"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    assert json.loads(captured.out.strip().splitlines()[-1])["max_new_tokens"] == 40


def test_a_reused_generation_is_probed_when_any_of_its_steps_is_due_and_masked_completions_never_count(
        tmp_path, one_torch_thread):
    """TRL reusing each generation for μ = 2 steps (num_iterations=2) with probe_every=2: batches start at
    steps 1, 3, 5, so probing on global_step + 1 alone fired at step 1 only, silently. And with
    mask_truncated_completions, a cut-off completion has no token: it is never picked, and
    probe/completions counts the completions probed. The readable warm-up (shipped) ends some answers
    within 22 tokens and not others."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    from forksight.trainer.model import load
    from forksight.trainer.shipped import materialize

    path = materialize("readable-s0", tmp_path / "readable")
    model, tokenizer = load(str(path))
    config = GRPOConfig(output_dir=str(tmp_path / "out"), report_to="none", use_cpu=True, bf16=False, seed=0,
                        per_device_train_batch_size=8, num_generations=4, max_completion_length=22,
                        learning_rate=1e-4, max_steps=6, logging_steps=1, save_strategy="no", disable_tqdm=True,
                        num_iterations=2, mask_truncated_completions=True)
    data = Dataset.from_list([{"prompt": f"{10 + 7 * i}+{20 + 3 * i}:"} for i in range(64)])
    trainer = GRPOTrainer(model=model, args=config, reward_funcs=even_first_token, train_dataset=data,
                          processing_class=tokenizer)
    db = str(tmp_path / "trl.duckdb")
    callback = forksight.trl.attach(trainer, db=db, run="reused", probe_every=2, probe_samples=8, probe_k=2,
                                    probe_positions=1, probe_budget=100.0)
    trainer.train()
    callback.detach()
    with Store(db) as store:
        reader = store.reader
        assert reader.probe_steps("reused") == [1, 3, 5]
        scalars = reader.read_scalars("reused", keys=["probe/completions"])
        truncated = reader.read_scalars("reused", keys=["completions/clipped_ratio"])
        for step in (1, 3, 5):
            probed = reader.read_probes("reused", step)["sample_id"].nunique()
            assert scalars[scalars.step == step].value.iloc[0] == probed, step
        assert 0 < truncated.value.max(), "no completion was cut off: the test needs some"
        assert min(scalars.value) < 8 or truncated.value.max() == 0
