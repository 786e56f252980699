"""prime-rl's per-token export, written by prime-rl's own TokenExporter (tests/data/prime_rl/
token_export.py, verbatim from PrimeIntellect-ai/prime-rl 559b447) on packed micro-batches whose
logprobs and entropies are computed here from logits, then read by forksight and imported: the
tokens table holds each completion's entropy and log p as computed (float32), environment text
between turns marked env, DPPO's masked tokens not selected, per-step means as the run's steps.
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
    text), then 3 padding tokens; logprobs and entropy from random logits, as the trainer computes them."""
    g = torch.Generator().manual_seed(seed)
    ids, pos, mask, env, lengths = [], [], [], [], []
    for prompt, turns in layout:
        n = prompt + len(turns)
        ids += [0] * n
        pos += list(range(n))
        mask += [False] * prompt + [bool(t) for t in turns]
        env += ["math"] * n
        lengths.append(n)
    ids, pos, mask, env = ids + [0] * 3, pos + [0] * 3, mask + [False] * 3, env + [""] * 3
    lengths[-1] += 3                                      # padding rides on the last sequence, trimmed
    logits = torch.randn(len(ids), VOCAB, generator=g, dtype=torch.float64) * 5   # some tokens near p = 1
    logp_all = torch.log_softmax(logits, -1)
    ids = torch.multinomial(logp_all.exp(), 1, generator=g)[:, 0].tolist()         # sampled from the policy
    logp = logp_all.gather(-1, torch.tensor(ids)[:, None])[:, 0]
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    inference = logp + torch.randn(len(ids), generator=g, dtype=torch.float64) * 1.5   # some drift past the mask
    advantages = torch.where(torch.arange(len(ids)) % 2 == 0, 1.0, -1.0).double()
    batch = {"input_ids": torch.tensor([ids]), "position_ids": torch.tensor([pos]), "loss_mask": torch.tensor([mask]),
             "advantages": advantages[None].float(), "inference_logprobs": inference[None].float(), "env_names": env}
    out = {"logprobs": logp[None].float(), "entropy": entropy[None].float()}
    return batch, out, lengths, (logp, entropy, inference, advantages, mask)


LAYOUTS = {1: [[(3, [1, 1, 1, 1]), (2, [1, 1, 0, 0, 1, 1])], [(4, [1, 1, 1])]],      # step 1: two micro-batches
           2: [[(2, [1] * 5), (5, [0, 0])]]}                                         # a sequence with nothing trained


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
    rows = []                    # (pos, entropy, logp, env, selected) in rank, micro-step, sequence order
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
                                 bool(t) and not masked))
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
        for row, (pos, h, lp, env, selected) in zip(got, want):
            assert row["step"] == step and row["pos"] == pos and row["env"] == env
            assert row["entropy"] == (None if h is None else pytest.approx(h, rel=1e-6))
            assert row["logp"] == (None if lp is None else pytest.approx(lp, rel=1e-6, abs=1e-6))
            assert row["selected"] == selected
        trained = [h for _, h, _, env, _ in want if not env]
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
    want = [lp for _, _, lp, env, _ in expected_rows(references, 1) if not env]
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
