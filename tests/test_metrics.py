"""forksight.hooks.metrics against independent float64 references (numpy/scipy) written here."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import jensenshannon
from scipy.special import logsumexp

from forksight.hooks import metrics
from forksight.hooks.metrics import (
    ENTROPY_EDGES,
    top_rho_mask,
    histogram,
    pass_at_k,
    pass_at_k_groups,
    summarize,
    token_covariance,
    token_kl,
    token_stats,
    top_rho_per_response,
)

TOL = 1e-4  # nats, float32 against float64


# ---------------------------------------------------------------------------- float64 references


def ref_stats(z: np.ndarray, temperature: float = 1.0) -> dict[str, np.ndarray]:
    """Per-row H, H2, top1 and log-probs from the definitions, in float64 (−inf allowed)."""
    z = np.asarray(z, dtype=np.float64) / temperature
    logq = z - logsumexp(z, axis=-1, keepdims=True)
    p = np.exp(logq)
    plogp = np.where(p > 0, p * np.where(p > 0, logq, 0.0), 0.0)
    return {
        "entropy": -plogp.sum(-1),
        "renyi2": -np.log((p**2).sum(-1)),
        "top1": p.max(-1),
        "logq": logq,
        "p": p,
    }


def ref_js(p: np.ndarray, mask: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """JS(p_i,t ‖ mean of p_j,t over active rows j of i's group), 0 where alone or inactive."""
    B, T, _ = p.shape
    out = np.zeros((B, T))
    for i, t in itertools.product(range(B), range(T)):
        peers = [j for j in range(B) if groups[j] == groups[i] and mask[j, t]]
        if not mask[i, t] or len(peers) < 2:
            continue
        mean = p[peers, t].mean(0)
        out[i, t] = jensenshannon(p[i, t], mean) ** 2  # scipy returns the distance sqrt(JS)
    return out


def random_logits(shape, scale=3.0, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # mixed sharpness per row: some rows near one-hot, some near uniform
    scales = torch.rand(shape[:-1] + (1,), generator=g) * scale * 2
    return torch.randn(shape, generator=g) * scales


# ---------------------------------------------------------------------------- token_stats


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
def test_stats_match_float64_reference(temperature):
    z = random_logits((3, 6, 97), seed=1)
    tokens = torch.randint(0, 97, (3, 6), generator=torch.Generator().manual_seed(2))
    stats = token_stats(z, tokens=tokens, temperature=temperature)
    ref = ref_stats(z.numpy(), temperature)
    for name in ("entropy", "renyi2", "top1"):
        np.testing.assert_allclose(getattr(stats, name).numpy(), ref[name], atol=TOL, err_msg=name)
    ref_logp = np.take_along_axis(ref["logq"], tokens.numpy()[..., None], -1)[..., 0]
    np.testing.assert_allclose(stats.logp.numpy(), ref_logp, atol=TOL)
    assert stats.js is None and stats.entropy.dtype == torch.float32


def test_properties_hold_on_many_random_rows():
    z = random_logits((8, 40, 301), scale=6.0, seed=3)
    stats = token_stats(z, tokens=torch.zeros(8, 40, dtype=torch.long), group_ids=[0, 0, 0, 1, 1, 2, 2, 2])
    log_v = math.log(301)
    assert bool((stats.renyi2 >= 0).all()) and bool((stats.renyi2 <= stats.entropy).all())
    assert bool((stats.entropy <= log_v + 1e-5).all())
    assert bool((stats.top1 > 0).all()) and bool((stats.top1 <= 1).all())
    assert bool((stats.logp <= 0).all())
    assert bool((stats.js >= 0).all()) and bool((stats.js <= math.log(2)).all())
    # H2 = -log Σp² ≥ -log max p (Σp² ≤ max p)
    assert bool((stats.renyi2 >= -torch.log(stats.top1) - 1e-5).all())


def test_uniform_rows_have_log_v_and_one_hot_rows_zero():
    V = 1000
    z = torch.zeros(2, 2, V)
    z[1] = -float("inf")
    z[1, :, 17] = 5.0  # one-hot by masking: every other logit -inf
    z[0, 1] = torch.full((V,), 3.0)
    z[1, 1, :] = -1e4
    z[1, 1, 3] = 0.0  # one-hot in float32 by a huge gap
    stats = token_stats(z, tokens=torch.tensor([[0, 5], [17, 3]]))
    np.testing.assert_allclose(stats.entropy[0].numpy(), [math.log(V)] * 2, atol=TOL)
    np.testing.assert_allclose(stats.renyi2[0].numpy(), [math.log(V)] * 2, atol=TOL)
    np.testing.assert_allclose(stats.top1[0].numpy(), [1 / V] * 2, rtol=1e-5)
    np.testing.assert_allclose(stats.logp[0].numpy(), [-math.log(V)] * 2, atol=TOL)
    assert stats.entropy[1].tolist() == [0.0, 0.0] and stats.renyi2[1].tolist() == [0.0, 0.0]
    assert stats.top1[1].tolist() == [1.0, 1.0] and stats.logp[1].tolist() == [0.0, 0.0]


def test_neg_inf_logits_equal_reference_over_finite_vocabulary():
    z = random_logits((4, 5, 64), seed=4)
    blocked = torch.rand(4, 5, 64, generator=torch.Generator().manual_seed(5)) < 0.5
    blocked[..., 0] = False  # keep at least one finite logit per row
    z = z.masked_fill(blocked, -float("inf"))
    tokens = torch.zeros(4, 5, dtype=torch.long)
    stats = token_stats(z, tokens=tokens, group_ids=[0, 0, 1, 1], chunk_size=3)
    for name in ("entropy", "renyi2", "top1", "logp", "js"):
        assert not torch.isnan(getattr(stats, name)).any(), name
    for b, t in itertools.product(range(4), range(5)):
        finite = z[b, t][~blocked[b, t]].numpy()
        ref = ref_stats(finite)
        assert abs(float(stats.entropy[b, t]) - ref["entropy"]) <= TOL
        assert abs(float(stats.renyi2[b, t]) - ref["renyi2"]) <= TOL
        assert abs(float(stats.logp[b, t]) - ref["logq"][0]) <= TOL
    ref = ref_stats(z.numpy())
    expected_js = ref_js(ref["p"], np.ones((4, 5), bool), np.array([0, 0, 1, 1]))
    np.testing.assert_allclose(stats.js.numpy(), expected_js, atol=TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_low_and_high_precision_logits_are_computed_in_float32(dtype):
    z = random_logits((2, 7, 211), seed=6).to(dtype)
    stats = token_stats(z, group_ids=[3, 3])
    ref = ref_stats(z.to(torch.float64).numpy())
    np.testing.assert_allclose(stats.entropy.numpy(), ref["entropy"], atol=TOL)
    np.testing.assert_allclose(stats.renyi2.numpy(), ref["renyi2"], atol=TOL)
    np.testing.assert_allclose(stats.js.numpy(), ref_js(ref["p"], np.ones((2, 7), bool), [3, 3]), atol=TOL)
    assert stats.entropy.dtype == torch.float32


def test_qwen_sized_vocabulary():
    V = 151_936
    z = random_logits((2, 2, V), scale=4.0, seed=7)
    z[0, 0] = 0.0  # uniform over the whole vocabulary: H = H2 = log V ≈ 11.93
    tokens = torch.tensor([[5, V - 1], [0, 12345]])
    stats = token_stats(z, tokens=tokens, group_ids=[0, 0], chunk_size=2)
    ref = ref_stats(z.numpy())
    np.testing.assert_allclose(stats.entropy.numpy(), ref["entropy"], atol=TOL)
    np.testing.assert_allclose(stats.renyi2.numpy(), ref["renyi2"], atol=TOL)
    ref_logp = np.take_along_axis(ref["logq"], tokens.numpy()[..., None], -1)[..., 0]
    np.testing.assert_allclose(stats.logp.numpy(), ref_logp, atol=TOL)
    np.testing.assert_allclose(stats.js.numpy(), ref_js(ref["p"], np.ones((2, 2), bool), [0, 0]), atol=TOL)
    assert abs(float(stats.entropy[0, 0]) - math.log(V)) <= TOL


def test_ragged_masks_js_uses_only_active_rollouts():
    z = random_logits((5, 6, 50), seed=8)
    mask = torch.ones(5, 6, dtype=torch.bool)
    mask[0, 4:] = False  # ragged completion lengths
    mask[1, 2:] = False
    mask[3, 1:] = False  # group 1 = rows 3, 4: only row 4 active from t = 1 on
    mask[2, :] = False  # an empty response
    groups = np.array([0, 0, 0, 1, 1])
    z[~mask] = float("nan")  # padding may hold garbage: it must not leak into any mean
    stats = token_stats(z, mask=mask, tokens=torch.zeros(5, 6, dtype=torch.long), group_ids=groups)
    zz = z.numpy().copy()
    zz[~mask.numpy()] = 0.0
    ref = ref_stats(zz)
    np.testing.assert_allclose(stats.js.numpy(), ref_js(ref["p"], mask.numpy(), groups), atol=TOL)
    np.testing.assert_allclose(stats.entropy.numpy(), ref["entropy"] * mask.numpy(), atol=TOL)
    for name in ("entropy", "renyi2", "top1", "logp", "js"):
        assert (getattr(stats, name)[~mask] == 0).all(), name
    assert bool((stats.js[4, 1:] == 0).all())  # alone in its group
    assert bool((stats.js[0, :2] > 0).all())


def test_groups_of_one_have_zero_js():
    z = random_logits((3, 4, 40), seed=9)
    stats = token_stats(z, group_ids=torch.tensor([7, 8, 9]))
    assert stats.js.abs().max().item() == 0.0
    # the same rows as one group do diverge
    assert token_stats(z, group_ids=[1, 1, 1]).js.min().item() > 0


def test_identical_rollouts_have_zero_js():
    row = random_logits((1, 5, 80), seed=10)
    stats = token_stats(row.expand(4, 5, 80).contiguous(), group_ids=[0, 0, 0, 0])
    assert stats.js.max().item() <= 1e-5


def test_one_hot_rollouts_on_different_tokens_match_reference():
    # p1, p2 one-hot on different tokens (all else -inf): P̄ = ½(p1 + p2), so M = (¾, ¼, 0, 0)
    z = torch.full((2, 1, 4), -float("inf"))
    z[0, 0, 0] = 0.0
    z[1, 0, 1] = 0.0
    stats = token_stats(z, group_ids=[0, 0])
    p = np.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0]])
    expected = jensenshannon(p[0], p.mean(0)) ** 2
    hand = 0.5 * math.log(4 / 3) + 0.5 * (0.5 * math.log(2 / 3) + 0.5 * math.log(2))  # ½KL(p‖M) + ½KL(P̄‖M)
    assert expected == pytest.approx(hand)
    np.testing.assert_allclose(stats.js[:, 0].numpy(), [hand, hand], atol=TOL)


def test_hidden_state_path_equals_logits_path():
    g = torch.Generator().manual_seed(11)
    hidden = torch.randn(3, 5, 16, generator=g)
    weight = torch.randn(70, 16, generator=g)
    bias = torch.randn(70, generator=g)
    tokens = torch.randint(0, 70, (3, 5), generator=g)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[2, 3:] = False
    kwargs = dict(mask=mask, tokens=tokens, group_ids=[0, 0, 1], temperature=0.9, chunk_size=4)
    from_hidden = token_stats(hidden=hidden, weight=weight, bias=bias, **kwargs)
    from_logits = token_stats(torch.nn.functional.linear(hidden, weight, bias), **kwargs)
    for name in ("entropy", "renyi2", "top1", "logp", "js"):
        torch.testing.assert_close(getattr(from_hidden, name), getattr(from_logits, name), atol=1e-5, rtol=0)
    # bf16 weights: logits are what the model computes in bf16, then float32 from there on
    w16 = weight.to(torch.bfloat16)
    from_hidden16 = token_stats(hidden=hidden, weight=w16, tokens=tokens)
    from_logits16 = token_stats(hidden.to(torch.bfloat16) @ w16.T, tokens=tokens)
    torch.testing.assert_close(from_hidden16.entropy, from_logits16.entropy, atol=1e-5, rtol=0)


def test_chunk_size_does_not_change_results():
    z = random_logits((4, 9, 33), seed=12)
    mask = torch.rand(4, 9, generator=torch.Generator().manual_seed(13)) < 0.8
    mask[:, 4] = False  # a hole every row shares: the positions to visit are no longer a run
    kwargs = dict(mask=mask, tokens=torch.ones(4, 9, dtype=torch.long), group_ids=[0, 1, 0, 1])
    results = [token_stats(z, chunk_size=c, **kwargs) for c in (1, 7, 10_000)]
    results += [token_stats(z, chunk_size=c, mask=mask) for c in (1, 7, 10_000)]
    for name in ("entropy", "renyi2", "top1", "logp", "js"):
        for other in results[1:3]:
            torch.testing.assert_close(getattr(results[0], name), getattr(other, name), atol=1e-6, rtol=0)
    for other in results[3:]:  # the path without JS agrees with the path with JS
        torch.testing.assert_close(results[0].entropy, other.entropy, atol=1e-6, rtol=0)
    ref = ref_stats(z.numpy())
    np.testing.assert_allclose(results[1].js.numpy(), ref_js(ref["p"], mask.numpy(), [0, 1, 0, 1]), atol=TOL)


def test_noncontiguous_logits_and_grad_inputs():
    base = random_logits((6, 4, 30), seed=14).requires_grad_(True)
    z = base.transpose(0, 1)  # [4, 6, 30] non-contiguous view with grad
    stats = token_stats(z, chunk_size=5)
    assert not stats.entropy.requires_grad
    np.testing.assert_allclose(stats.entropy.numpy(), ref_stats(z.detach().numpy())["entropy"], atol=TOL)


def test_empty_batches_give_empty_results():
    for shape in ((0, 4, 10), (3, 0, 10)):
        stats = token_stats(torch.zeros(shape), tokens=torch.zeros(shape[:2], dtype=torch.long),
                            group_ids=list(range(shape[0])))
        assert stats.entropy.shape == shape[:2] and stats.js.shape == shape[:2]
    assert token_kl(torch.zeros(0, 4, 10), torch.zeros(0, 4, 10)).shape == (0, 4)


def test_bad_inputs_raise_clear_errors():
    z = torch.randn(2, 3, 10)
    with pytest.raises(ValueError, match="mask has shape"):
        token_stats(z, mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="exactly one"):
        token_stats(z, hidden=torch.randn(2, 3, 4), weight=torch.randn(10, 4))
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        token_stats(z, tokens=torch.full((2, 3), 10))
    with pytest.raises(ValueError, match="temperature"):
        token_stats(z, temperature=0)
    with pytest.raises(ValueError, match="group_ids"):
        token_stats(z, group_ids=[0, 1, 2])
    bad = z.clone()
    bad[1, 2, 4] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        token_stats(bad)
    mask = torch.ones(2, 3, dtype=torch.bool)
    mask[1, 2] = False
    assert not torch.isnan(token_stats(bad, mask=mask).entropy).any()  # masked garbage is fine
    tokens = torch.full((2, 3), -100)
    tokens[0] = 1
    assert token_stats(z, mask=tokens >= 0, tokens=tokens).logp[1].tolist() == [0.0] * 3


# ---------------------------------------------------------------------------- the fused (compiled) path


def _fused_case(dtype):
    z = random_logits((6, 7, 997), scale=4.0, seed=31)
    z[0, 0, :400] = -float("inf")  # masked vocabulary
    mask = torch.ones(6, 7, dtype=torch.bool)
    mask[1, 4:] = False  # ragged lengths, garbage in the padding
    mask[4, 1:] = False
    z[~mask] = float("nan")
    tokens = torch.randint(0, 997, (6, 7), generator=torch.Generator().manual_seed(32))
    tokens[0, 0] = 500  # a token the masked row can sample
    return z.to(dtype), mask, tokens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("native", [True, False], ids=["C++ kernels", "torch.compile kernels"])
def test_fused_path_matches_float64_reference_and_the_eager_path(dtype, native, monkeypatch):
    if not native:
        monkeypatch.setenv("FORKSIGHT_NATIVE", "0")
    z, mask, tokens = _fused_case(dtype)
    zz = z.to(torch.float64).numpy().copy()
    zz[~mask.numpy()] = 0.0
    ref = ref_stats(zz, temperature=0.8)
    ref_logp = np.take_along_axis(ref["logq"], tokens.numpy()[..., None], -1)[..., 0] * mask.numpy()
    for groups in ([0, 0, 0, 1, 1, 1], None):  # runs of equal size: the fused JS kernel; no JS
        kw = dict(mask=mask, tokens=tokens, group_ids=groups, temperature=0.8, chunk_size=5)
        fused = token_stats(z, fused=True, **kw)
        eager = token_stats(z, fused=False, **kw)
        for name in ("entropy", "renyi2", "top1"):
            np.testing.assert_allclose(getattr(fused, name).numpy(), ref[name] * mask.numpy(), atol=TOL, err_msg=name)
        np.testing.assert_allclose(fused.logp.numpy(), ref_logp, atol=TOL)
        if groups:
            np.testing.assert_allclose(fused.js.numpy(), ref_js(ref["p"], mask.numpy(), groups), atol=TOL)
        names = ("entropy", "renyi2", "top1", "logp") + (("js",) if groups else ())
        for name in names:
            torch.testing.assert_close(getattr(fused, name), getattr(eager, name), atol=2e-5, rtol=0)
    from forksight.hooks.metrics import fused as fused_kernels

    ran = {"rows (C++)", "position (C++)"} if native else {"sums", "position"}
    assert ran <= set(fused_kernels.kernels_run())  # the kernels did run


@pytest.mark.parametrize("rows", [18, 70])
def test_fused_js_of_a_large_group_matches_the_reference(rows):
    # one group of 18: the C++ kernel (up to 64 rows); of 70: torch.compile's wide kernel
    z = random_logits((rows, 3, 97), seed=33)
    stats = token_stats(z, group_ids=[0] * rows, fused=True)
    ref = ref_stats(z.numpy())
    np.testing.assert_allclose(stats.js.numpy(), ref_js(ref["p"], np.ones((rows, 3), bool), [0] * rows), atol=TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpp_kernels_match_the_reference_on_ragged_vocabularies_groups_and_threads(dtype):
    from forksight.hooks.metrics import fused as fused_kernels
    from forksight.hooks.metrics import native

    # V not a multiple of the 8 lanes; groups of 1, 5 and 16 rows
    for vocab, k in ((13, 5), (1001, 16), (4103, 1)):
        z = random_logits((2 * k, 9, vocab), scale=5.0, seed=vocab).to(dtype)
        mask = torch.rand(2 * k, 9, generator=torch.Generator().manual_seed(k)) > 0.25
        z[~mask] = float("nan")  # garbage where rows are inactive
        z[0, 0, : vocab // 2] = -float("inf")
        tokens = torch.randint(0, vocab, (2 * k, 9), generator=torch.Generator().manual_seed(vocab))
        tokens[0, 0] = vocab - 1  # a token the row with -inf logits can sample
        zz = z.to(torch.float64).numpy().copy()
        zz[~mask.numpy()] = 0.0
        ref = ref_stats(zz, temperature=1.3)
        ref_logp = np.take_along_axis(ref["logq"], tokens.numpy()[..., None], -1)[..., 0] * mask.numpy()
        for groups in (None, [0] * k + [1] * k):  # the `rows` kernel; the `position` kernel
            got = token_stats(z, mask=mask, tokens=tokens, group_ids=groups, temperature=1.3, fused=True)
            for name in ("entropy", "renyi2", "top1"):
                np.testing.assert_allclose(getattr(got, name).numpy(), ref[name] * mask.numpy(), atol=TOL,
                                           err_msg=name)
            np.testing.assert_allclose(got.logp.numpy(), ref_logp, atol=TOL)
            if groups:
                np.testing.assert_allclose(got.js.numpy(), ref_js(ref["p"], mask.numpy(), groups), atol=TOL)
    assert {"rows (C++)", "position (C++)"} <= set(fused_kernels.kernels_run())
    # positions split across threads give the same bits as one thread
    z = random_logits((6, 11, 777), seed=3).to(dtype).view(11, 2, 3, 777)
    w = torch.full((11, 2, 3), 1 / 3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native.position(z, 1.0, w)
        one_rows = native.rows(z.view(-1, 777), 1.0)
        torch.set_num_threads(2)
        two = native.position(z, 1.0, w)
        two_rows = native.rows(z.view(-1, 777), 1.0)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(one + one_rows, two + two_rows))
    # NaN, +inf or only -inf at a valid position: the same clear error as the other paths
    for value, where in ((float("nan"), 7), (float("inf"), 3), (-float("inf"), slice(None))):
        bad = random_logits((4, 3, 50), seed=5).to(dtype)
        bad[1, 2, where] = value
        for groups in (None, [0, 0, 1, 1]):
            with pytest.raises(ValueError, match="NaN/\\+inf logits or only -inf"):
                token_stats(bad, group_ids=groups, fused=True)


def test_cpp_kernels_still_run_in_a_forked_child_after_using_threads_in_the_parent():
    import multiprocessing

    z = random_logits((4, 8, 300), seed=9).view(8, 2, 2, 300)  # [c, G, k, V]: a view of [B, T, V] is laid out alike
    w = torch.full((8, 2, 2), 0.5)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        from forksight.hooks.metrics import native

        parent = native.position(z, 1.0, w)  # the pool's threads now exist, in this process only
        with multiprocessing.get_context("fork").Pool(1) as pool:
            child = pool.apply_async(_position_in_child, (z, w)).get(timeout=120)
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(parent, child))


def _position_in_child(z, w):
    from forksight.hooks.metrics import native

    torch.set_num_threads(2)
    return native.position(z, 1.0, w)


DEFAULT_PATH_CHILD = """
import torch
from forksight.hooks.metrics import fused, token_stats
token_stats(torch.randn(4, 3, 50), group_ids=[0, 0, 1, 1])     # 600 logits: eager
print(fused.kernels_run())
token_stats(torch.randn(8, 32, 300), group_ids=[0] * 4 + [1] * 4)  # 76,800 logits: over NATIVE_MIN_ELEMENTS
token_stats(torch.randn(8, 32, 300).to(torch.bfloat16))
print(fused.kernels_run())
"""


def test_by_default_the_cpp_kernels_take_calls_from_their_threshold_on():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", DEFAULT_PATH_CHILD], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("\n")[:2] == ["[]", "['position (C++)', 'rows (C++)']"]


def test_cpp_kernels_build_with_pips_ninja_when_none_is_on_path(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    # every tool on PATH but ninja (a venv's python run without activating it: pip's ninja is not on PATH)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in filter(os.path.isdir, os.environ["PATH"].split(os.pathsep)):
        for tool in Path(folder).iterdir():
            if tool.name != "ninja" and not (bin_dir / tool.name).exists():
                (bin_dir / tool.name).symlink_to(tool)
    child = ("import shutil, torch\n"
             "from forksight.hooks.metrics import fused, native, token_stats\n"
             "assert shutil.which('ninja') is None\n"
             "token_stats(torch.randn(2, 3, 40), fused=True)\n"
             "print(fused.kernels_run(), native.failure())\n")
    env = {**os.environ, "PATH": str(bin_dir), "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions")}
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "['rows (C++)'] None"


NATIVE_FALLBACK_CHILD = """
import warnings, torch
from forksight.hooks.metrics import fused, token_stats
z = torch.randn(4, 3, 50)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    got = token_stats(z, group_ids=[0, 0, 1, 1], fused=True)
eager = token_stats(z, group_ids=[0, 0, 1, 1], fused=False)
torch.testing.assert_close(got.js, eager.js, atol=2e-5, rtol=0)
assert any("building the C++ per-token kernels failed" in str(w.message) for w in seen), [str(w.message) for w in seen]
print(fused.kernels_run())
"""


def test_without_a_usable_extensions_dir_the_compiled_kernels_answer_with_a_warning(tmp_path):
    import os
    import subprocess
    import sys

    blocker = tmp_path / "a-file"  # the build directory would have to live under a file: a real failure
    blocker.write_text("")
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(blocker / "ext")}
    out = subprocess.run([sys.executable, "-c", NATIVE_FALLBACK_CHILD], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "'position'" in out.stdout and "C++" not in out.stdout  # the compiled kernel took over


FALLBACK_CHILD = """
import warnings, torch
from forksight.hooks.metrics import fused, token_stats
fused.FUSED_MIN_ELEMENTS = fused.NATIVE_MIN_ELEMENTS = 0  # take the fused path even for this small call
z = torch.randn(4, 3, 50)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    auto = token_stats(z, tokens=torch.zeros(4, 3, dtype=torch.long), group_ids=[0, 0, 1, 1])
eager = token_stats(z, tokens=torch.zeros(4, 3, dtype=torch.long), group_ids=[0, 0, 1, 1], fused=False)
assert torch.equal(auto.js, eager.js) and torch.equal(auto.entropy, eager.entropy)
assert any("using the eager path" in str(w.message) for w in seen), [str(w.message) for w in seen]
assert any("building the C++ per-token kernels failed" in str(w.message) for w in seen)
try:
    token_stats(z, fused=True)
except RuntimeError as err:
    print("refused:", err)
"""


def test_without_a_working_compiler_the_eager_path_answers_with_a_warning(tmp_path):
    import os
    import subprocess
    import sys

    # a real failure: no C++ compiler where inductor looks for it, and no cached kernels to reuse
    env = {**os.environ, "CXX": str(tmp_path / "no-such-g++"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"),
           "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions")}
    out = subprocess.run([sys.executable, "-c", FALLBACK_CHILD], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "refused: the fused per-token kernels cannot run here" in out.stdout


# ---------------------------------------------------------------------------- token_kl


def test_token_kl_matches_reference_and_is_zero_on_itself():
    s = random_logits((2, 5, 60), seed=15)
    t = random_logits((2, 5, 60), seed=16)
    s[0, 0, :30] = -float("inf")  # student puts no mass there: the teacher's -inf is harmless
    t[0, 0, :10] = -float("inf")
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 4] = False
    kl = token_kl(s, t, mask=mask, chunk_size=3)
    ps, pt = ref_stats(s.numpy()), ref_stats(t.numpy())
    expected = np.where(ps["p"] > 0, ps["p"] * (ps["logq"] - np.where(ps["p"] > 0, pt["logq"], 0)), 0).sum(-1)
    np.testing.assert_allclose(kl.numpy(), expected * mask.numpy(), atol=TOL)
    assert token_kl(s, s).abs().max().item() <= 1e-5
    assert token_kl(s.to(torch.bfloat16), t.to(torch.bfloat16), chunk_size=1).shape == (2, 5)
    t[1, 1, 5] = -float("inf")  # the teacher forbids a token the student may sample
    assert token_kl(s, t)[1, 1].item() == float("inf")


# ---------------------------------------------------------------------------- pass@k


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of k-subsets of n samples (c correct) that hold at least one correct sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_matches_brute_force_enumeration():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12)
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


def test_pass_at_k_hand_worked_values_and_large_n():
    assert pass_at_k(2, 1, 1) == 0.5
    assert pass_at_k(3, 1, 2) == pytest.approx(2 / 3)  # 1 - C(2,2)/C(3,2)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    # stable where the binomials overflow floats: C(2000, 500) ≈ 1e487
    assert pass_at_k(2000, 1, 500) == pytest.approx(0.25)


@pytest.mark.parametrize("n,c,k,what", [(3, 1, 4, "k = 4"), (3, 4, 1, "cannot exceed"), (3, -1, 1, "c >= 0"), (3, 1, 0, "k >= 1")])
def test_pass_at_k_rejects_impossible_counts(n, c, k, what):
    with pytest.raises(ValueError, match=what):
        pass_at_k(n, c, k)


def test_pass_at_k_groups_rectangular_and_ragged():
    correct = np.array([[1, 0, 0, 0], [1, 1, 0, 1], [0, 0, 0, 0]], dtype=bool)
    result = pass_at_k_groups(correct)
    assert sorted(result) == [1, 2, 3, 4]
    for k in range(1, 5):
        expected = np.mean([brute_pass_at_k(4, int(row.sum()), k) for row in correct])
        assert result[k] == pytest.approx(expected)
    assert result[1] == pytest.approx(4 / 12)
    assert pass_at_k_groups(torch.tensor(correct), ks=[2]) == {2: pytest.approx(result[2])}
    ragged = [[True, False], [False, False, True, True]]
    got = pass_at_k_groups(ragged)
    assert got[1] == pytest.approx((0.5 + 0.5) / 2)
    assert got[2] == pytest.approx((1.0 + brute_pass_at_k(4, 2, 2)) / 2)
    assert got[3] == pytest.approx(brute_pass_at_k(4, 2, 3))  # the 2-sample group is left out of k=3
    with pytest.raises(ValueError, match="outside"):
        pass_at_k_groups(correct, ks=[5])
    with pytest.raises(ValueError, match="non-empty"):
        pass_at_k_groups([])


# ---------------------------------------------------------------------------- selection helpers


def test_top_rho_mask_keeps_top_rho_of_valid_tokens():
    g = torch.Generator().manual_seed(17)
    entropy = torch.rand(16, 50, generator=g) * 3
    mask = torch.rand(16, 50, generator=g) < 0.7
    selected, threshold = top_rho_mask(entropy, mask, rho=0.2)
    assert threshold == pytest.approx(float(np.quantile(entropy[mask].numpy(), 0.8)), abs=1e-6)
    assert not bool((selected & ~mask).any())
    assert abs(selected.sum().item() / mask.sum().item() - 0.2) <= 0.01
    assert bool((entropy[selected] >= threshold).all())
    with_nan = entropy.clone()
    with_nan[0] = float("nan")  # not computed: neither selected nor counted in the quantile
    nan_selected, nan_threshold = top_rho_mask(with_nan, mask, rho=0.2)
    assert nan_threshold == pytest.approx(float(np.quantile(entropy[1:][mask[1:]].numpy(), 0.8)), abs=1e-6)
    assert not bool(nan_selected[0].any())
    empty, inf = top_rho_mask(entropy, torch.zeros_like(mask))
    assert not bool(empty.any()) and inf == float("inf")


def test_top_rho_per_response_matches_numpy_percentile():
    g = torch.Generator().manual_seed(18)
    score = torch.rand(5, 40, generator=g)
    mask = torch.ones(5, 40, dtype=torch.bool)
    mask[1, 3:] = False  # short response: still at least one token
    mask[2] = False  # empty response: none
    mask[3, ::2] = False
    selected = top_rho_per_response(score, mask, rho=0.1)
    for i in range(5):
        valid = mask[i].numpy()
        if not valid.any():
            assert not selected[i].any()
            continue
        threshold = np.percentile(score[i].numpy()[valid], 90)
        expected = (score[i].numpy() >= threshold - 1e-7) & valid
        assert np.array_equal(selected[i].numpy(), expected)
        assert selected[i].sum() >= 1
    assert selected[0].sum().item() == 4  # 40 tokens, top 10% ≥ the 90th percentile
    score[4, :20] = float("nan")  # not computed: the row's percentile comes from the rest
    got = top_rho_per_response(score, mask, rho=0.1)[4]
    assert not bool(got[:20].any())
    assert torch.equal(got[20:], top_rho_per_response(score[4:, 20:], mask[4:, 20:], rho=0.1)[0])


def test_token_covariance_matches_numpy():
    g = torch.Generator().manual_seed(19)
    logp = -torch.rand(4, 6, generator=g) * 5
    mask = torch.rand(4, 6, generator=g) < 0.75
    adv = torch.randn(4, generator=g)
    cov = token_covariance(adv, logp, mask)
    a = np.broadcast_to(adv.numpy()[:, None], (4, 6))
    m = mask.numpy()
    expected = (a - a[m].mean()) * (logp.numpy() - logp.numpy()[m].mean()) * m
    np.testing.assert_allclose(cov.numpy(), expected, atol=1e-6)
    per_token = torch.randn(4, 6, generator=g)
    expected2 = (per_token.numpy() - per_token.numpy()[m].mean()) * (logp.numpy() - logp.numpy()[m].mean()) * m
    np.testing.assert_allclose(token_covariance(per_token, logp, mask).numpy(), expected2, atol=1e-6)
    with pytest.raises(ValueError, match="advantages"):
        token_covariance(torch.randn(3), logp, mask)


# ---------------------------------------------------------------------------- histograms and summaries


def test_entropy_edges_resolve_low_entropy_and_cover_qwen_vocab():
    edges = ENTROPY_EDGES
    assert edges[0] == 0.0 and np.all(np.diff(edges) > 0)
    assert edges[-1] >= math.log(151_936)
    assert (edges < 0.01).sum() >= 10  # the mass below 0.01 nats is split into ≥ 10 bins
    assert metrics.FORK_ENTROPY in edges


def test_histogram_counts_match_numpy_with_overflow_in_last_bin():
    g = np.random.default_rng(20)
    values = np.concatenate([g.exponential(0.5, 1000), [0.0, 15.0, 30.0, ENTROPY_EDGES[-1]]])
    counts = histogram(torch.tensor(values))
    expected, _ = np.histogram(np.clip(values, 0, ENTROPY_EDGES[-1]), bins=ENTROPY_EDGES)
    assert counts.tolist() == expected.tolist() and counts.sum() == values.size
    assert counts[-1] >= 3
    assert histogram([0.5, 1.5, 2.5], edges=[0, 1, 2]).tolist() == [1, 2]
    with pytest.raises(ValueError, match="NaN"):
        histogram([float("nan")])


def test_summarize_matches_numpy_over_valid_tokens():
    z = random_logits((4, 10, 64), scale=4.0, seed=21)
    mask = torch.rand(4, 10, generator=torch.Generator().manual_seed(22)) < 0.6
    stats = token_stats(z, mask=mask, tokens=torch.zeros(4, 10, dtype=torch.long), group_ids=[0, 0, 1, 1])
    summary = summarize(stats)
    m = mask.numpy()
    h = stats.entropy.numpy()[m].astype(np.float64)
    assert summary["tokens/count"] == m.sum()
    assert summary["entropy/mean"] == pytest.approx(h.mean(), abs=1e-6)
    for name, q in (("p20", 0.2), ("p50", 0.5), ("p80", 0.8), ("p95", 0.95)):
        assert summary[f"entropy/{name}"] == pytest.approx(np.quantile(h, q), abs=1e-6)
    assert summary["fork/frac"] == pytest.approx((h >= 0.672).mean())
    for key, field in (("renyi2/mean", "renyi2"), ("top1/mean", "top1"), ("logp/mean", "logp"), ("js/mean", "js")):
        assert summary[key] == pytest.approx(getattr(stats, field).numpy()[m].mean(), abs=1e-6)
    bare = summarize(token_stats(z))
    assert "logp/mean" not in bare and "js/mean" not in bare
    assert summarize(token_stats(z, mask=torch.zeros(4, 10, dtype=torch.bool))) == {"tokens/count": 0.0}
    # NaN = not computed (hooks fill JS for a sample of groups): means skip it, None drops the key
    partial = metrics.TokenStats(stats.entropy, None, stats.top1, None, stats.js.clone(), stats.mask)
    partial.js[2:] = float("nan")
    got = summarize(partial)
    assert "renyi2/mean" not in got and "logp/mean" not in got
    assert got["js/mean"] == pytest.approx(stats.js.numpy()[:2][m[:2]].mean(), abs=1e-6)


# ---------------------------------------------------------------------------- memory bound

MEMORY_CHILD = r"""
import torch
from forksight.hooks.metrics import token_stats
torch.set_num_threads(1)

def status(key):  # bytes, from the kernel's own accounting of this process
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key))

def growth(fn):  # peak RSS above the RSS before fn: writing 5 to clear_refs resets the peak
    open("/proc/self/clear_refs", "w").write("5")
    before = status("VmRSS:")
    fn()
    return status("VmHWM:") - before

B, T, V, chunk = 2, 48, 151_936, 8
z = torch.empty(B, T, V).normal_(0, 3)
tokens = torch.zeros(B, T, dtype=torch.long)
token_stats(z[:, :2], tokens=tokens[:, :2], group_ids=[0, 0], chunk_size=1)  # load kernels
plain = growth(lambda: token_stats(z, tokens=tokens, chunk_size=chunk))
js = growth(lambda: token_stats(z, tokens=tokens, group_ids=[0, 0], chunk_size=chunk))
whole = growth(lambda: torch.log_softmax(z, -1))  # the whole-tensor way: the probe must see it
print(plain, js, whole, chunk * V * 4, z.numel() * 4)
"""


def test_peak_extra_memory_stays_within_the_chunk_budget():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD], capture_output=True, text=True, check=True)
    plain, js, whole, chunk_bound, logits_bytes = map(int, out.stdout.split())
    assert plain <= chunk_bound + 2 * 2**20, (plain, chunk_bound)  # + small: [B, T] outputs, allocator
    assert js <= chunk_bound + 2 * 2**20, (js, chunk_bound)
    assert whole >= 0.9 * logits_bytes, (whole, logits_bytes)  # the probe sees a B·T·V allocation


def test_summarize_means_per_part_and_lengths_over_rows_with_tokens():
    z = random_logits((4, 6, 32), scale=3.0, seed=23)
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0]]).bool()
    stats = token_stats(z, mask=mask, tokens=torch.zeros(4, 6, dtype=torch.long))
    h, m = stats.entropy.numpy().astype(np.float64), mask.numpy()
    # rows 0-1 one micro-batch, rows 2-3 another (TRL averages per-micro-batch means)
    got = summarize(stats, parts=torch.tensor([0, 0, 1, 1]))
    assert got["entropy/mean"] == pytest.approx((h[:2][m[:2]].mean() + h[2:][m[2:]].mean()) / 2, abs=1e-9)
    assert summarize(stats)["entropy/mean"] == pytest.approx(h[m].mean(), abs=1e-9)
    # row 3 has no token (another rank's row, or never seen): not a completion of length 0
    assert got["length/mean"] == pytest.approx((6 + 2 + 3) / 3)
    selected = torch.zeros(4, 6, dtype=torch.bool)
    selected[:, 0] = True
    assert summarize(stats, selected=selected)["selected/frac"] == pytest.approx(3 / 11)
