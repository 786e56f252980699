"""prime-rl's per-token export, written by prime-rl's own TokenExporter (tests/data/prime_rl/
token_export.py, verbatim from PrimeIntellect-ai/prime-rl 559b447) on packed micro-batches whose
logprobs and entropies are computed here from logits (the tokens sampled by a perturbed copy of the
policy, as an inference engine would), then read by forksight and imported: the tokens table holds
each completion's entropy, trainer log p and sampler log p as computed (float32), environment text
between turns marked env, DPPO's masked tokens not selected, per-step means as the run's steps, and
the `mismatch/*` scalars prime-rl's own trainer logs under its names (mismatch_kl, is_masked).
prime-rl itself (its trainer needs a GPU, vLLM and its config package) is not installed: the test
provides the two names the writer imports from it, DefaultLossConfig's mask bounds (0.2/0.2, its
defaults) and compute_importance_ratio_and_mismatch_kl (prime_rl/trainer/rl/loss.py, the same three lines)."""
from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from forksight.monitor.importers import SourceError, read_source

WRITER = Path(__file__).resolve().parent / "data" / "prime_rl" / "token_export.py"
VOCAB = 40


class DefaultLossConfig:                       # prime_rl.configs.trainer.DefaultLossConfig's defaults
    dppo_mask_low = 0.2
    dppo_mask_high = 0.2


def compute_importance_ratio_and_mismatch_kl(trainer_logprobs, inference_logprobs):   # prime_rl...loss
    log_importance_ratio = trainer_logprobs - inference_logprobs
    importance_ratio = torch.exp(log_importance_ratio)
    mismatch_kl = importance_ratio - log_importance_ratio - 1
    return log_importance_ratio, importance_ratio, mismatch_kl


@pytest.fixture(scope="module")
def token_export():
    configs = types.ModuleType("prime_rl.configs.trainer")
    configs.DefaultLossConfig, configs.TrainerConfig = DefaultLossConfig, object
    loss = types.ModuleType("prime_rl.trainer.rl.loss")
    loss.compute_importance_ratio_and_mismatch_kl = compute_importance_ratio_and_mismatch_kl
    saved = {k: sys.modules.get(k) for k in ("prime_rl.configs.trainer", "prime_rl.trainer.rl.loss")}
    sys.modules.update({"prime_rl.configs.trainer": configs, "prime_rl.trainer.rl.loss": loss})
    try:
        spec = importlib.util.spec_from_file_location("prime_rl_token_export", WRITER)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module


def packed_batch(seed: int, layout: list[tuple[int, list[int]]]):
    """One packed micro-batch: per sequence (prompt length, turn pattern of 1 = sampled, 0 = environment
    text, 2 = trained with rl weight 0: a ce-only token the policy did not sample), then 3 padding tokens;
    the engine samples from perturbed logits, the trainer's logprobs and entropy come from the logits."""
    g = torch.Generator().manual_seed(seed)
    ids, pos, mask, env, lengths, rl = [], [], [], [], [], []
    for prompt, turns in layout:
        n = prompt + len(turns)
        ids += [0] * n
        pos += list(range(n))
        mask += [False] * prompt + [bool(t) for t in turns]
        rl += [0.0] * prompt + [float(t == 1) for t in turns]
        env += ["math"] * n
        lengths.append(n)
    ids, pos, mask, env, rl = ids + [0] * 3, pos + [0] * 3, mask + [False] * 3, env + [""] * 3, rl + [0.0] * 3
    lengths[-1] += 3                                      # padding rides on the last sequence, trimmed
    logits = torch.randn(len(ids), VOCAB, generator=g, dtype=torch.float64) * 5   # some tokens near p = 1
    logp_all = torch.log_softmax(logits, -1)
    # the engine's distribution drifts from the trainer's (some tokens past DPPO's mask, some outside 2x)
    engine_all = torch.log_softmax(logits + torch.randn(logits.shape, generator=g, dtype=torch.float64) * 1.2, -1)
    ids = torch.multinomial(engine_all.exp(), 1, generator=g)[:, 0].tolist()       # sampled by the engine
    logp = logp_all.gather(-1, torch.tensor(ids)[:, None])[:, 0]
    inference = engine_all.gather(-1, torch.tensor(ids)[:, None])[:, 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    advantages = torch.where(torch.arange(len(ids)) % 2 == 0, 1.0, -1.0).double()
    batch = {"input_ids": torch.tensor([ids]), "position_ids": torch.tensor([pos]), "loss_mask": torch.tensor([mask]),
             "advantages": advantages[None].float(), "inference_logprobs": inference[None].float(), "env_names": env}
    if 2 in [t for _, turns in layout for t in turns]:
        batch["rl_weights"] = torch.tensor([rl])
    out = {"logprobs": logp[None].float(), "entropy": entropy[None].float()}
    return batch, out, lengths, (logp, entropy, inference, advantages, mask)


LAYOUTS = {1: [[(3, [1, 1, 1, 1]), (2, [1, 1, 0, 0, 1, 1])], [(4, [1, 1, 1])]],      # step 1: two micro-batches
           2: [[(2, [1] * 5 + [2, 2]), (5, [0, 0])]]}           # ce-only tokens; a sequence with nothing trained


@pytest.fixture(scope="module")
def exported(token_export, tmp_path_factory):
    out = tmp_path_factory.mktemp("prime") / "outputs"
    references = {}
    for rank in (0, 1):
        exporter = token_export.TokenExporter(out, rank)
        for step, micro_batches in LAYOUTS.items():
            for micro_step, layout in enumerate(micro_batches):
                batch, model_out, lengths, ref = packed_batch(100 * step + 10 * micro_step + rank, layout)
                exporter.export(step, micro_step, batch, model_out, lengths, DefaultLossConfig())
                references[(step, rank, micro_step)] = (layout, ref)
        exporter.mark_stable()
    return out, references


def expected_rows(references, step):
    rows = []        # (pos, entropy, logp, env, selected, sampler logp, masked) in rank, micro-step, sequence order
    for (s, rank, micro_step), (layout, (logp, entropy, inference, adv, mask)) in sorted(references.items()):
        if s != step:
            continue
        start = 0
        for prompt, turns in layout:
            if any(turns):
                for i, t in enumerate(turns):
                    j = start + prompt + i
                    delta = float(np.exp(np.float32(logp[j])) - np.exp(np.float32(inference[j])))
                    masked = (delta > 0.2) if adv[j] > 0 else (delta < -0.2)
                    rows.append((i, float(entropy[j]) if t else None, float(logp[j]) if t else None, not t,
                                 bool(t) and not masked, float(inference[j]) if t == 1 else None, bool(t) and masked))
            start += prompt + len(turns)
    return rows


def test_the_writers_files_are_read_as_tokens(exported):
    out, references = exported
    lines = (out / "token_exports" / "step_1" / "rank_0.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["schema_version"] == 1 and (out / "token_exports" / "step_1" / "STABLE").exists()
    run = read_source(out)
    assert run.kind == "prime-rl" and run.steps == [1, 2] and len(run.tokens) == 2
    for step, table in zip(run.steps, run.tokens):
        got = table.to_pylist()
        want = expected_rows(references, step)
        assert len(got) == len(want)
        for row, (pos, h, lp, env, selected, *_) in zip(got, want):
            assert row["step"] == step and row["pos"] == pos and row["env"] == env
            assert row["entropy"] == (None if h is None else pytest.approx(h, rel=1e-6))
            assert row["logp"] == (None if lp is None else pytest.approx(lp, rel=1e-6, abs=1e-6))
            assert row["selected"] == selected
        trained = [h for _, h, _, env, *_ in want if not env]
        assert run.rows[run.steps.index(step)]["entropy/mean"] == pytest.approx(np.mean(trained), rel=1e-6)
    trained_rows = [r["selected"] for t in run.tokens for r in t.to_pylist() if not r["env"]]
    assert any(trained_rows) and not all(trained_rows)                             # DPPO masked some
    # the sequence with nothing trained is not exported at all (the writer skips it)
    assert len({r["sample_id"] for r in run.tokens[1].to_pylist()}) == 2          # one per rank at step 2


def test_import_fills_the_tokens_page(exported, tiny_model_path, tmp_path, capsys):
    from transformers import AutoTokenizer

    from forksight.compose import cli
    from forksight.dashboard.pages.tokens import render_step
    from forksight.monitor.collector.store import Store

    out, references = exported
    assert cli.main(["import", str(out / "token_exports"), "--db", str(tmp_path / "p.duckdb"), "--run", "p",
                     "--tokenizer", str(tiny_model_path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["format"] == "prime-rl" and summary["tokens"] == sum(len(expected_rows(references, s)) for s in (1, 2))
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path)
    store = Store(str(tmp_path / "p.duckdb"))
    try:
        assert store.reader.token_steps("p") == [1, 2]
        tokens = store.reader.read_tokens("p", 1)
        scalars = store.reader.read_scalars("p", downsample=100_000)
        page = render_step(store.reader, "p", 1, None, "entropy")
    finally:
        store.close()
    want = [lp for _, _, lp, env, *_ in expected_rows(references, 1) if not env]
    assert tokens[~tokens["env"]]["logp"].tolist() == pytest.approx(want, rel=1e-6, abs=1e-6)
    assert tokens["token"].tolist() == [tokenizer.decode([i]) for i in tokens["token_id"]]
    assert set(scalars["key"]) >= {"entropy/mean", "fork/frac"}
    # the tokens page: every exported sequence is offered, the first drawn token by token with its entropy
    assert [o["value"] for o in page["options"]] == [str(i) for i in sorted(set(tokens["sample_id"]))]
    spans = page["main"][0].children[1].children
    first = tokens[tokens["sample_id"] == page["sample_id"]].sort_values("pos")
    assert len(spans) == len(first) and [sp.children for sp in spans] == [t or "∅" for t in first["token"]]
    h = first["entropy"].iloc[0]
    assert f"entropy H {h:.4f}" in spans[0].title


def test_a_line_that_is_not_the_export_says_what_was_expected(tmp_path):
    step = tmp_path / "token_exports" / "step_0"
    step.mkdir(parents=True)
    (step / "rank_0.jsonl").write_text('{"step": 0}\n')
    with pytest.raises(SourceError, match="no token_ids/loss_mask; expected prime-rl's token export"):
        read_source(tmp_path)
    (step / "rank_0.jsonl").write_text('{"schema_version": 2, "token_ids": [1], "loss_mask": [true]}\n')
    with pytest.raises(SourceError, match="schema_version 2"):
        read_source(tmp_path)


def test_a_step_without_stable_is_still_being_written_and_left_out(exported, tmp_path):
    import shutil

    out, _ = exported
    copy = tmp_path / "outputs"
    shutil.copytree(out, copy)
    (copy / "token_exports" / "step_2" / "STABLE").unlink()
    run = read_source(copy)
    assert run.steps == [1] and run.config["skipped_unstable_steps"] == [2]
    assert read_source(copy / "token_exports" / "step_2").steps == [2]     # asked for by name: read


def test_an_export_past_the_row_limit_is_cut_at_a_sequence_and_says_so(exported, monkeypatch):
    from forksight.monitor.importers import prime_rl

    out, references = exported
    monkeypatch.setattr(prime_rl, "MAX_TOKENS", 10)
    run = read_source(out)
    first = 4 + 6                   # step 1, rank 0, micro-step 0: the first two sequences' completions
    assert run.steps == [1] and run.tokens[0].num_rows == first and run.config["truncated_at_tokens"] == 10


def exported_lines(out: Path, step: int) -> list[dict]:
    """Every sequence prime-rl's writer exported for a step, in rank order, as written."""
    files = sorted((out / "token_exports" / f"step_{step}").glob("rank_*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def by_hand(references, step):
    """float64 per trained, sampled token of a step: (log r, sequence number, fork, masked), from the
    fixture's log-probs as stored (float32)."""
    from forksight.base.constants import FORK_ENTROPY

    out, seq = [], -1
    for pos, h, lp, env, _, sampler, masked in expected_rows(references, step):
        seq += pos == 0                 # each exported sequence's completion starts at pos 0
        if sampler is not None:
            lr = float(np.float32(lp)) - float(np.float32(sampler))
            out.append((lr, seq, h >= FORK_ENTROPY, masked))
    return out


def test_sampler_logp_and_mismatch_as_prime_rl_logs_them(exported):
    """inference_logprobs is the sampler's log p; the step's mismatch/* come from forksight's own function
    and agree with prime-rl's own per-token mismatch_kl and is_masked, aggregated as its trainer logs them
    (mismatch_kl/all/mean and is_masked over the loss-mask tokens with a non-zero rl weight)."""
    from forksight.compose.doctor import load

    out, references = exported
    raw = read_source(out)
    loaded = load(str(out), fork_rule="abs:0.672")      # by_hand's forks: H >= 0.672
    for step in (1, 2):
        want = expected_rows(references, step)
        got = raw.tokens[raw.steps.index(step)].to_pylist()
        assert [r["sampler_logp"] for r in got] == [None if w[5] is None else pytest.approx(w[5], rel=1e-6, abs=1e-6)
                                                   for w in want]
        row = loaded.rows[loaded.steps.index(step)]
        # prime-rl's own per-token fields, as its trainer aggregates them
        kl, masked = [], []
        for line in exported_lines(out, step):
            rl = line["rl_weights"]
            for i, m in enumerate(line["loss_mask"]):
                if m and (rl[i] is None or rl[i] != 0):
                    kl.append(line["mismatch_kl"][i])
                    masked.append(line["is_masked"][i])
        assert row["mismatch/tokens"] == len(kl)
        assert row["mismatch/kl_k3"] == pytest.approx(np.mean(kl), rel=1e-5, abs=1e-7)
        assert row["mismatch/frac_corrected"] == pytest.approx(np.mean(masked))
        # and a float64 recomputation from the fixture's log-probs
        tokens = by_hand(references, step)
        lr = np.array([t[0] for t in tokens])
        assert row["mismatch/kl_k1"] == pytest.approx(np.mean(-lr), rel=1e-9)
        assert row["mismatch/logp_diff_abs_max"] == pytest.approx(np.abs(lr).max(), rel=1e-9)
        assert row["mismatch/frac_outside_2x"] == pytest.approx(np.mean(np.abs(lr) > np.log(2)))
        assert row["mismatch/is_ratio_max"] == pytest.approx(np.exp(lr).max(), rel=1e-9)
        fork = np.array([t[2] for t in tokens])
        if fork.any():
            k3 = np.exp(lr) - 1 - lr
            assert row["mismatch/kl_k3/fork"] == pytest.approx(k3[fork].mean(), rel=1e-9)
        seqs = np.array([t[1] for t in tokens])
        w = np.array([np.exp(lr[seqs == s].sum()) for s in np.unique(seqs)])
        assert row["mismatch/seq_ess"] == pytest.approx(w.sum() ** 2 / (w.size * (w ** 2).sum()), rel=1e-9)
    assert 0 < loaded.rows[0]["mismatch/frac_corrected"] < 1 and loaded.rows[0]["mismatch/frac_outside_2x"] > 0
    assert len(loaded.histograms) == 2 and not loaded.notes
    # the ce-only tokens of step 2 (rl weight 0) were trained but not sampled by the policy: no sampler log p
    step2 = raw.tokens[1].to_pylist()
    assert any(not r["env"] and r["sampler_logp"] is None for r in step2)


def test_import_stores_sampler_logp_and_the_mismatch_histogram(exported, tmp_path, capsys):
    from forksight.base.constants import MISMATCH_EDGES
    from forksight.compose import cli
    from forksight.monitor.collector.store import Store

    out, references = exported
    db = str(tmp_path / "m.duckdb")
    assert cli.main(["import", str(out), "--db", db, "--run", "m"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["histograms"] == 2
    with Store(db) as store:
        tokens = store.reader.read_tokens("m", 1)
        hist = store.reader.read_histograms("m", "mismatch_log_ratio", downsample=100)
        scalars = store.reader.read_scalars("m", downsample=100_000)
    want = [w[5] for w in expected_rows(references, 1)]
    assert [None if v != v else v for v in tokens["sampler_logp"]] == \
        [None if w is None else pytest.approx(w, rel=1e-6, abs=1e-6) for w in want]
    for step in (1, 2):
        lr = np.array([t[0] for t in by_hand(references, step)])
        # np.histogram's bins, with values past either end counted in the end bins
        clipped = np.clip(lr, MISMATCH_EDGES[0], np.nextafter(MISMATCH_EDGES[-1], -np.inf))
        counts, _ = np.histogram(clipped, bins=MISMATCH_EDGES)
        mine = hist[hist["step"] == step].sort_values("bin_lo")
        assert mine["bin_lo"].tolist() == pytest.approx(MISMATCH_EDGES[:-1].tolist())
        assert mine["count"].tolist() == counts.tolist()
        tokens_key = scalars[(scalars["key"] == "mismatch/tokens") & (scalars["step"] == step)]["value"]
        assert tokens_key.tolist() == [lr.size]
    assert {"mismatch/kl_k1", "mismatch/kl_k3/nonfork", "mismatch/frac_corrected"} <= set(scalars["key"])


def test_a_sampler_logp_that_cannot_be_one_is_stored_null_and_said_once(tmp_path, capsys):
    """A positive inference log p is no log-probability: null, with a warning on stderr; a loss that
    computes no mask (is_masked all null) gives no frac_corrected."""
    from forksight.compose import cli
    from forksight.monitor.collector.store import Store

    step = tmp_path / "token_exports" / "step_3"
    step.mkdir(parents=True)
    n = 6
    line = {"schema_version": 1, "step": 3, "token_ids": list(range(n)), "loss_mask": [False] + [True] * 5,
            "trainer_logprobs": [None, -0.5, -1.0, -0.2, -2.0, -0.1],
            "inference_logprobs": [0.0, -0.4, 0.7, None, -2.5, -0.1], "entropy": [None, 1.0, 0.1, 0.2, 2.0, 0.3],
            "is_masked": [None] * n, "rl_weights": [None] * n, "ref_kl_weights": [None] * n}
    (step / "rank_0.jsonl").write_text(json.dumps(line) + "\n")
    db = str(tmp_path / "b.duckdb")
    assert cli.main(["import", str(tmp_path), "--db", db, "--run", "b"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "1 sampler log p value(s)" in err and "stored as null" in err
    with Store(db) as store:
        tokens = store.reader.read_tokens("b", 3)
        scalars = store.reader.read_scalars("b", downsample=1000)
    assert [None if v != v else v for v in tokens["sampler_logp"]] == \
        [pytest.approx(-0.4), None, None, pytest.approx(-2.5), pytest.approx(-0.1)]
    values = dict(zip(scalars["key"], scalars["value"]))
    lr = np.array([-0.5 + 0.4, -2.0 + 2.5, -0.1 + 0.1])
    assert values["mismatch/tokens"] == 3 and values["mismatch/kl_k1"] == pytest.approx(np.mean(-lr), abs=1e-6)
    assert "mismatch/frac_corrected" not in values


@pytest.mark.parametrize("rule", ["abs:0.672", "top:0.3"])
def test_import_flags_forks_under_the_given_rule_and_records_it(exported, tmp_path, capsys, rule):
    from forksight.base.fork_rule import ForkRule
    from forksight.compose import cli
    from forksight.monitor.collector.store import Store

    out, references = exported
    db = str(tmp_path / f"{rule.replace(':', '_')}.duckdb")
    assert cli.main(["import", str(out / "token_exports"), "--db", db, "--run", "p", "--fork-rule", rule]) == 0
    with Store(db) as store:
        config = store.reader.run("p")["config"]
        scalars = store.reader.read_scalars("p", downsample=100_000)
        tokens = {s: store.reader.read_tokens("p", s) for s in (1, 2)}
    assert config["fork_rule"] == rule
    parsed = ForkRule.parse(rule)
    for step, table in tokens.items():
        trained = [h for _, h, _, env, *_ in expected_rows(references, step) if not env]
        tau = parsed.value if parsed.kind == "abs" else float(np.quantile(np.array(trained, np.float64), 0.7))
        at = scalars[scalars.step == step].set_index("key").value
        assert at["fork/threshold"] == pytest.approx(tau, rel=1e-6)
        assert at["fork/frac"] == pytest.approx(np.mean(np.array(trained) >= at["fork/threshold"]))
        mine = table[~table["env"]]
        assert (mine["fork"] == (mine["entropy"] >= at["fork/threshold"] - 1e-7)).all()


def test_a_bad_fork_rule_is_refused_and_nothing_is_created(exported, tmp_path, capsys):
    from forksight.compose import cli

    out, _ = exported
    assert cli.main(["import", str(out / "token_exports"), "--db", str(tmp_path / "x.duckdb"), "--fork-rule",
                     "top:0"]) == 2
    assert "fork rule 'top:0'" in capsys.readouterr().err and not (tmp_path / "x.duckdb").exists()
