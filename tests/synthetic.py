"""A synthetic GRPO run whose entropy collapses, written through the store's write API: what
the browser tests, screenshots and the dashboard benchmark look at (a test fixture, not part of
the product package; bench/ puts tests/ on sys.path to use it)."""

# Per step it draws token entropies from a mixture (a growing share near 0, the rest spread
# with a scale that decays), and derives every logged number from those draws, so the
# scalars, histograms and token rows of a step agree with each other as a real run's do.
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from forksight.base.constants import ENTROPY_EDGES, FORK_ENTROPY
from forksight.hooks.metrics import histogram
from forksight.base.records import Records, histograms_table, samples_table, scalars_table, tokens_table


PROMPTS = ((12, 35), (47, 26), (38, 19), (21, 44), (33, 33), (49, 17))


def entropy_at(step: int, steps: int, collapse: bool = True) -> float:
    """The scale of the entropy draw: decays to ~0 over the run when collapse, else flat."""
    return 1.4 * math.exp(-4.0 * step / max(steps, 1)) + 0.01 if collapse else 1.2


def token_entropies(rng: np.random.Generator, n: int, step: int, steps: int,
                    collapse: bool = True) -> np.ndarray:
    """n token entropies: a share near zero (grows as the run collapses), the rest gamma."""
    progress = step / max(steps, 1) if collapse else 0.0
    near_zero = rng.random(n) < 0.3 + 0.68 * (1 - math.exp(-4 * progress))
    low = np.exp(rng.normal(math.log(0.003), 1.0, n))
    spread = rng.gamma(1.5, entropy_at(step, steps, collapse) / 1.5, n)
    return np.minimum(np.where(near_zero, low, spread), math.log(311))


def step_records(rng: np.random.Generator, step: int, steps: int, *, strategy: str = "fork",
                 collapse: bool = True, groups: int = 4, group_size: int = 4,
                 token_samples: int = 16, hist_tokens: int = 2000,
                 wall_time: float | None = None, token_entropy: float | None = None) -> Records:
    """All records of one step: scalars, the entropy histogram, samples and token rows
    (token_entropy: every token row's entropy near this value, as in a collapsed step)."""
    h = token_entropies(rng, hist_tokens, step, steps, collapse)
    progress = step / max(steps, 1)
    p1 = 0.3 + 0.5 * (1 - math.exp(-5 * progress)) if collapse else 0.3 + 0.3 * progress
    correct = rng.random((groups, group_size)) < p1
    pass_g = float(np.mean(correct.any(axis=1)))
    scal = {"entropy/mean": float(h.mean()), "renyi2/mean": float(0.72 * h.mean()),
            "js/mean": float(0.08 * h.mean() + 0.002), "top1/mean": float(np.exp(-h).mean()),
            "fork/frac": float((h >= FORK_ENTROPY).mean()),
            "selected/frac": float((h >= np.quantile(h, 0.8)).mean()) if strategy == "fork"
            else 1.0, "cov/logp_adv": float(0.02 * math.exp(-3 * progress) + rng.normal(0, 0.003)),
            "reward/mean": float(correct.mean()), "pass@1": float(correct.mean()),
            f"pass@{group_size}": max(pass_g, float(correct.mean())),
            "loss": float(rng.normal(0.0, 0.05)), "kl": float(0.01 * progress),
            "grad_norm": float(abs(rng.normal(1.0, 0.2)) * (1 + h.mean())),
            "length/mean": float(14 - 2 * progress), "lr": 3e-4}
    for q in (20, 50, 80, 95):
        scal[f"entropy/p{q}"] = float(np.quantile(h, q / 100))
    rows = [{"step": step, "key": k, "value": v, "wall_time": wall_time} for k, v in scal.items()]
    hist = [{"step": step, "key": "entropy", "counts": histogram(h).tolist(),
             "edges": ENTROPY_EDGES.tolist()}]
    samples, cols = [], {c: [] for c in ("sample_id", "pos", "token_id", "token", "entropy",
                                         "renyi2", "js", "logp", "top1", "fork", "selected")}
    for g in range(groups):
        a, b = PROMPTS[int(rng.integers(len(PROMPTS)))]   # a small pool: prompts recur
        prompt = f"{a}+{b}="
        for j in range(group_size):
            sid = g * group_size + j
            total = a + b if correct[g, j] else int(rng.integers(20, 99))
            # a short worked chain, answer reversed as the tiny model writes it
            answer = f"{a % 10}+{b % 10}={a % 10 + b % 10} ans {str(total)[::-1]}"
            samples.append({"step": step, "sample_id": sid, "group_id": g, "prompt": prompt,
                            "completion": answer, "reward": float(correct[g, j]),
                            "correct": bool(correct[g, j]), "length": len(answer),
                            "source": "synthetic"})
            if sid >= token_samples:
                continue
            ent = token_entropies(rng, len(answer), step, steps, collapse) \
                if token_entropy is None else token_entropy * rng.lognormal(0, 0.2, len(answer))
            threshold = np.quantile(ent, 0.8)
            for pos, tok in enumerate(answer):
                cols["sample_id"].append(sid)
                cols["pos"].append(pos)
                cols["token_id"].append(ord(tok))
                cols["token"].append(tok)
                cols["entropy"].append(float(ent[pos]))
                cols["renyi2"].append(float(0.72 * ent[pos]))
                cols["js"].append(float(0.08 * ent[pos]))
                cols["logp"].append(float(-ent[pos] * rng.uniform(0.3, 1.2)))
                cols["top1"].append(float(math.exp(-ent[pos])))
                cols["fork"].append(bool(ent[pos] >= FORK_ENTROPY))
                cols["selected"].append(bool(ent[pos] >= threshold) if strategy == "fork"
                                        else True)
    return Records(scalars=scalars_table(rows), histograms=histograms_table(hist),
                   samples=samples_table(samples), tokens=tokens_table(cols, step=step))


def seed_run(store, name: str, steps: int, *, steps_total: int | None = None,
             strategy: str = "fork", collapse: bool = True, seed: int = 0, writer=None,
             **kw) -> str:
    """Create a run (vocab 311, like the tiny model) and write its first `steps` steps of a
    run shaped to last `steps_total` (default: steps), i.e. a run still in progress.
    writer: what batches go through (an Ingest, so the alert hub judges them; default store)."""
    rng = np.random.default_rng(seed)
    run_id = store.create_run(name, strategy=strategy, model="tiny-qwen2",
                              config={"vocab_size": 311, "synthetic": True})
    write_steps(writer or store, run_id, range(steps), steps_total or steps, rng,
                strategy=strategy, collapse=collapse, **kw)
    return run_id


def write_steps(store, run_id: str, step_range, total: int, rng: np.random.Generator, *,
                chunk: int = 25, **kw) -> None:
    """Write the given steps of a synthetic run, `chunk` steps per batch, and wait until
    they are committed (one batch per step costs a transaction each)."""
    steps, futures = list(step_range), []
    for i in range(0, len(steps), chunk):
        parts = [step_records(rng, s, total, **kw) for s in steps[i:i + chunk]]
        merged = Records(**{name: pa.concat_tables([getattr(p, name) for p in parts])
                            for name in ("scalars", "tokens", "samples", "histograms")})
        futures.append(store.write(run_id, merged, batch_id=f"syn-{steps[i]}-{len(parts)}"))
    for fut in futures:
        fut.result()


def bulk_tokens(run_id_steps: int, rows_per_step: int, seed: int = 0, first_step: int = 0
                ) -> pa.Table:
    """Per-token rows for many steps at once, vectorised (10M rows in seconds): the
    benchmark's load; values follow the same mixture as token_entropies."""
    rng = np.random.default_rng(seed)
    n = run_id_steps * rows_per_step
    step = np.repeat(np.arange(first_step, first_step + run_id_steps, dtype=np.int64),
                     rows_per_step)
    within = np.tile(np.arange(rows_per_step, dtype=np.int64), run_id_steps)
    seq_len = 64
    ent = np.where(rng.random(n) < 0.6, np.exp(rng.normal(-5.8, 1.0, n)),
                   rng.gamma(1.5, 0.5, n)).astype(np.float32)
    token_id = rng.integers(16, 26, n).astype(np.int32)
    vocab = pa.array([str(d) for d in range(10)])
    return pa.table({
        "step": step, "sample_id": within // seq_len, "pos": (within % seq_len).astype(np.int32),
        "token_id": token_id, "token": vocab.take(pa.array(token_id - 16)),
        "entropy": ent, "renyi2": (0.72 * ent).astype(np.float32),
        "js": (0.08 * ent).astype(np.float32),
        "logp": (-ent * rng.uniform(0.3, 1.2, n)).astype(np.float32),
        "top1": np.exp(-ent).astype(np.float32), "fork": ent >= FORK_ENTROPY,
        "selected": ent >= 0.3})
