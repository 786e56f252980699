"""Training–inference mismatch at token level: the `mismatch/*` scalars against hand-worked numbers
and a float64 reference written another way, the sampler's log p through `forksight.attach` into a real
DuckDB file, and bad sampler input stored as null with a warning, never a crash."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

import forksight
from forksight.base.constants import MISMATCH_BANDS, MISMATCH_EDGES
from forksight.compose.local import LocalSink
from forksight.hooks.metrics.mismatch import clean_sampler_logp, mismatch_scalars

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_hand_worked_ratios_three_and_a_third():
    # p_train = (0.6, 0.1), p_sampler = (0.2, 0.3): r = (3, 1/3) on one sequence
    logp, sampler = _t([[math.log(0.6), math.log(0.1)]]), _t([[math.log(0.2), math.log(0.3)]])
    out = mismatch_scalars(logp, sampler, torch.ones(1, 2, dtype=torch.bool))
    k1 = (-math.log(3) - math.log(1 / 3)) / 2                      # = 0
    k3 = ((3 - 1 - math.log(3)) + (1 / 3 - 1 + math.log(3))) / 2   # the logs cancel: (3 + 1/3 - 2) / 2
    assert out["mismatch/kl_k1"] == pytest.approx(k1, abs=1e-12)
    assert out["mismatch/kl_k3"] == pytest.approx(k3, rel=1e-12)
    assert out["mismatch/kl_k3"] == pytest.approx(2 / 3, rel=1e-12)   # 3 + 1/3 − 2 over 2
    assert out["mismatch/is_ratio_min"] == pytest.approx(1 / 3) and out["mismatch/is_ratio_max"] == pytest.approx(3)
    assert out["mismatch/is_ratio_mean"] == pytest.approx(5 / 3)
    assert out["mismatch/logp_diff_abs_mean"] == pytest.approx(math.log(3))
    assert out["mismatch/frac_outside_2x"] == 1.0 and out["mismatch/frac_outside_5x"] == 0.0
    # one sequence: its weight is 3 * 1/3 = 1, so log w = 0 and the ESS of one weight is 1
    assert out["mismatch/seq_log_ratio_max"] == pytest.approx(0.0, abs=1e-12)
    assert out["mismatch/seq_ess"] == pytest.approx(1.0)
    assert out["mismatch/tokens"] == 2


def test_sequence_weights_two_and_a_half_give_the_hand_worked_ess():
    # sequence weights w = (2, 1/2): ESS/n = (2.5)^2 / (2 * (4 + 0.25)) = 6.25 / 8.5
    logp = _t([[math.log(0.8), 0.0], [math.log(0.25), 0.0]])
    sampler = _t([[math.log(0.4), 0.0], [math.log(0.5), 0.0]])
    mask = torch.tensor([[True, False], [True, False]])
    out = mismatch_scalars(logp, sampler, mask)
    assert out["mismatch/seq_ess"] == pytest.approx(6.25 / 8.5)
    assert out["mismatch/seq_log_ratio_max"] == pytest.approx(math.log(2))
    assert out["mismatch/tokens"] == 2   # masked positions never count


def _reference(logp: np.ndarray, sampler: np.ndarray, mask: np.ndarray, fork: np.ndarray):
    """float64, by probabilities and per-token loops (not log space): the keys a user would compute."""
    out = {}
    for name, where in (("", mask), ("/fork", mask & fork), ("/nonfork", mask & ~fork)):
        p_t, p_s = np.exp(logp[where]), np.exp(sampler[where])
        r = p_t / p_s
        out[f"mismatch/kl_k1{name}"] = float(np.mean(np.log(p_s / p_t)))
        out[f"mismatch/kl_k3{name}"] = float(np.mean([ri - 1 - math.log(ri) for ri in r]))
        out[f"mismatch/frac_outside_2x{name}"] = float(np.mean((r > 2) | (r < 0.5)))
        out[f"mismatch/frac_outside_5x{name}"] = float(np.mean((r > 5) | (r < 0.2)))
        out[f"mismatch/is_ratio_p99{name}"] = float(np.percentile(r, 99))
    weights = [np.prod(np.exp(logp[b][mask[b]]) / np.exp(sampler[b][mask[b]])) for b in range(len(mask))
               if mask[b].any()]
    w = np.asarray(weights)
    out["mismatch/seq_ess"] = float(w.sum() ** 2 / (len(w) * (w ** 2).sum()))
    out["mismatch/seq_log_ratio_max"] = float(np.max(np.abs(np.log(w))))
    return out


def test_random_batch_matches_a_float64_reference_with_the_fork_split():
    rng = np.random.default_rng(7)
    logp = np.log(rng.uniform(0.01, 1.0, (6, 9)))
    sampler = np.minimum(logp + rng.normal(0, 0.6, logp.shape), 0.0)
    mask = rng.uniform(size=logp.shape) < 0.8
    fork = rng.uniform(size=logp.shape) < 0.3
    got = mismatch_scalars(torch.tensor(logp), torch.tensor(sampler), torch.tensor(mask), fork=torch.tensor(fork))
    for key, value in _reference(logp, sampler, mask, fork).items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert got["mismatch/kl_k3"] >= 0 and 0 < got["mismatch/seq_ess"] <= 1
    assert "mismatch/frac_corrected" not in got


def test_frac_corrected_counts_the_runs_own_truncation_over_known_tokens():
    logp = _t([[-0.1, -0.2, -0.3, -0.4]])
    sampler = _t([[-0.1, math.nan, -1.0, -2.0]])     # one token without a sampler log p
    corrected = torch.tensor([[False, True, True, False]])
    out = mismatch_scalars(logp, sampler, torch.ones(1, 4, dtype=torch.bool), corrected=corrected)
    assert out["mismatch/tokens"] == 3 and out["mismatch/frac_corrected"] == pytest.approx(1 / 3)


def test_no_sampler_log_p_means_no_keys():
    nan = torch.full((2, 3), math.nan)
    assert mismatch_scalars(torch.zeros(2, 3), nan, torch.ones(2, 3, dtype=torch.bool)) == {}


def test_impossible_log_p_values_become_unknown_and_are_counted():
    values = torch.tensor([[-0.5, math.inf, -math.inf, 0.7, math.nan, 5.0]])
    mask = torch.tensor([[True, True, True, True, True, False]])   # the last one is padding
    cleaned, message = clean_sampler_logp(values, mask, "sampler_logp")
    assert cleaned[0, 0] == pytest.approx(-0.5) and torch.isnan(cleaned[0, 1:5]).all()
    assert cleaned[0, 5] == 5.0   # padding is nobody's business
    assert "3 sampler log p value(s)" in message and "stored as null" in message
    assert clean_sampler_logp(values[:, :1], mask[:, :1], "x")[1] is None


def test_edges_are_symmetric_and_mark_the_bands():
    assert np.allclose(MISMATCH_EDGES, -MISMATCH_EDGES[::-1]) and 0.0 in MISMATCH_EDGES
    for band in MISMATCH_BANDS:
        assert np.isclose(MISMATCH_EDGES, math.log(band), atol=1e-6).any()


# ---------------------------------------------------------------------------- through attach
def _batch(tokenizer):
    texts = ["Q: 12+34= A: 46", "Q: 1+2= A: 3", "Q: 55+5= A: 60", "Q: 9+9= A: 18"]
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    labels[:, :4] = -100
    return enc, labels


def _sampler_logps(model, enc, labels, noise: float) -> list[torch.Tensor]:
    """A 'sampler': the same weights with noise on the logits, its log p of each completion token."""
    with torch.no_grad():
        logits = model(**enc).logits[:, :-1].double()
    logits = logits + noise * torch.randn(logits.shape, generator=torch.Generator().manual_seed(3),
                                          dtype=torch.float64)
    logp = torch.log_softmax(logits, -1)
    targets = labels[:, 1:]
    rows = []
    for b in range(targets.shape[0]):
        cols = (targets[b] != -100).nonzero().flatten()
        rows.append(logp[b, cols, targets[b, cols]])
    return rows


def test_attach_stores_the_sampler_log_p_and_the_step_scalars_agree_with_the_rows(tiny, tmp_path):
    model, tokenizer = tiny
    enc, labels = _batch(tokenizer)
    rows = _sampler_logps(model, enc, labels, noise=0.5)
    sink = LocalSink(str(tmp_path / "mm.duckdb"), "mm")
    with forksight.attach(model, sink=sink, tokenizer=tokenizer, group_size=2, sample=2) as handle:
        handle.log_sampler_logp(rows)
        model(**enc, labels=labels).loss.backward()
    sink.flush()
    tokens = sink.reader.read_tokens(sink.run_id, 0).sort_values(["sample_id", "pos"])
    scalars = sink.reader.read_scalars(sink.run_id).set_index("key")["value"]
    hist = sink.reader.read_histograms(sink.run_id, "mismatch_log_ratio")
    sink.finish()
    # the stored column is the sampler's log p of each stored token, in order (float32 storage)
    for sample_id, part in tokens.groupby("sample_id"):
        np.testing.assert_allclose(part["sampler_logp"].to_numpy(), rows[sample_id].numpy(), atol=1e-6)
    # the step's k3 recomputed from every row's trainer log p (a float64 forward of our own) and sampler log p
    with torch.no_grad():
        logits = model(**enc).logits[:, :-1].double()
    targets = labels[:, 1:]
    k3, ratios = [], []
    for b in range(targets.shape[0]):
        cols = (targets[b] != -100).nonzero().flatten()
        lr = torch.log_softmax(logits[b, cols], -1)[torch.arange(cols.numel()), targets[b, cols]] - rows[b]
        k3 += (torch.exp(lr) - 1 - lr).tolist()
        ratios += lr.tolist()
    assert scalars["mismatch/kl_k3"] == pytest.approx(float(np.mean(k3)), rel=1e-4)
    assert scalars["mismatch/tokens"] == len(k3)
    # the histogram holds every token's log ratio in its bin
    assert hist["count"].sum() == len(k3) and set(hist["step"]) == {0}
    assert np.allclose(np.sort(hist["bin_lo"].unique()), MISMATCH_EDGES[:-1])
    expected, _ = np.histogram(np.clip(ratios, MISMATCH_EDGES[0], MISMATCH_EDGES[-1] - 1e-9), MISMATCH_EDGES)
    stored = hist.sort_values("bin_lo")["count"].to_numpy()
    assert np.abs(stored - expected).sum() <= 2   # float32 vs float64 may move a value across an edge


def test_attach_without_sampler_stores_nulls_and_no_mismatch_keys(tiny, tmp_path):
    model, tokenizer = tiny
    enc, labels = _batch(tokenizer)
    sink = LocalSink(str(tmp_path / "none.duckdb"), "none")
    with forksight.attach(model, sink=sink, tokenizer=tokenizer, group_size=2):
        model(**enc, labels=labels).loss.backward()
    sink.flush()
    tokens = sink.reader.read_tokens(sink.run_id, 0)
    keys = set(sink.reader.read_scalars(sink.run_id)["key"])
    sink.finish()
    assert len(tokens) and tokens["sampler_logp"].isna().all()
    assert not any(k.startswith("mismatch/") for k in keys) and "entropy/mean" in keys


def test_bad_sampler_input_is_stored_as_null_with_a_warning_and_training_goes_on(tiny, tmp_path, caplog):
    model, tokenizer = tiny
    enc, labels = _batch(tokenizer)
    rows = _sampler_logps(model, enc, labels, noise=0.0)
    rows[0] = rows[0].clone()
    rows[0][1] = math.nan          # unknown: null, no complaint
    rows[0][2] = math.inf          # impossible: null, warned
    rows[1] = rows[1][:2]          # too short for its completion: the row is stored without
    sink = LocalSink(str(tmp_path / "bad.duckdb"), "bad")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with forksight.attach(model, sink=sink, tokenizer=tokenizer, group_size=2, sample=2) as handle:
            handle.log_sampler_logp(rows)
            model(**enc, labels=labels).loss.backward()
    sink.flush()
    tokens = sink.reader.read_tokens(sink.run_id, 0).sort_values(["sample_id", "pos"])
    scalars = sink.reader.read_scalars(sink.run_id).set_index("key")["value"]
    sink.finish()
    text = " ".join(str(w.message) for w in caught) + caplog.text
    assert "cannot be a log-probability" in text and "give one per token" in text
    first = tokens[tokens.sample_id == 0]["sampler_logp"].to_numpy()
    assert np.isnan(first[1]) and np.isnan(first[2]) and np.isfinite(np.delete(first, [1, 2])).all()
    assert tokens[tokens.sample_id == 1]["sampler_logp"].isna().all()
    # the same weights with no noise: what is known agrees to float32 rounding
    assert scalars["mismatch/logp_diff_abs_max"] < 1e-4
    assert scalars["mismatch/tokens"] == len(rows[0]) - 2 + sum(len(r) for r in rows[2:])


def test_a_sampler_log_p_of_another_shape_is_refused_by_the_reporter_with_a_warning(tmp_path):
    from forksight.hooks.capture.report import StepReporter
    from forksight.hooks.metrics import TokenStats

    sink = LocalSink(str(tmp_path / "shape.duckdb"), "shape")
    mask = torch.ones(2, 3, dtype=torch.bool)
    zeros = torch.zeros(2, 3)
    stats = TokenStats(entropy=zeros + 0.5, renyi2=zeros + 0.4, top1=zeros + 0.5, logp=zeros - 0.7, js=zeros,
                       mask=mask)
    with pytest.warns(UserWarning, match=r"shape \(2, 4\).*not stored"):
        scalars = StepReporter(sink).report(0, stats, torch.zeros(2, 3, dtype=torch.long),
                                            sampler_logp=torch.zeros(2, 4))
    sink.finish()
    assert not any(k.startswith("mismatch/") for k in scalars) and scalars["tokens/count"] == 6
