"""A study with the power to say which rule finds the pivotal tokens (docs/algorithms.md §12, issue 50
item 3). Plain GRPO on the readable preset at the sweep's lr and the preset's (where it collapses), for
each RL seed: every `--every` steps the bundled trainer probes `--samples` of the step's completions
(undecided groups first) and as many held-out ones (problems whose verdicts differ first), every position,
K continuations. Beside each probe the bench records, with the same policy, each probed token's ICT JS
(to its group's mean), top-1 margin (p1 - p2) and the step's H quantiles (a wrapper around the trainer's
own probe calls: the trained trajectory is unchanged). bench/probe_rules.py then scores every rule on the
same completions with bootstrap intervals: pooled, by phase (start, middle, end), by split, by lr, and
around the preset-lr runs' first entropy-collapse alert.

    python bench/probes.py --out docs/probes.json --markdown docs/probes.md     # ~40 min on 2 cores
    python bench/probes.py --render docs/probes.json --markdown docs/probes.md  # the page only

Every run starts from the seed-0 warm-up (cached); --seeds changes the RL phase's seed only; runs go
--jobs at a time, one thread each."""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

from page_io import add_page_options, commit, rendered_only, write_outputs
from readable_warm import steps3_model, warm_model

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TAUS = (0.1, 0.3, 0.672, 1.0, 1.5)


STUDY = dict(eval_every=25, eval_problems=16, eval_samples=4)   # held-out completions at every probe
# the problems trained on: the readable preset's own (4 memorised two-digit sums: groups mostly decided,
# 0.08 pivots per probed completion, docs/probes_readable.json) or fresh three-digit worked sums from
# their own warm start (sampled pass@1 0.3, 40-58 tokens, 0/1 reward: most groups undecided)
PROBLEMS = {"readable": {}, "steps3": dict(level=2, graded=False, problem_pool=0, max_new_tokens=58)}
WORDS = {"readable": "the readable preset (its 4 memorised two-digit worked sums, graded reward)",
         "steps3": "the readable preset's RL settings on fresh three-digit worked sums (the `steps` task at "
                   "level 2, warmed to sampled pass@1 0.3; 40-58-token completions; reward 1 for the right answer)"}


def _signals(ctx, roll, groups: list[int], base: int) -> dict:
    """sample_id -> the probed tokens' JS, margin and the step's H quantiles, as the policy now sees them."""
    import torch

    from forksight.base.fork_rule import ForkRule
    from forksight.hooks import metrics
    from forksight.trainer.rollout import completion_logits

    with torch.no_grad():
        logits = completion_logits(ctx.model, roll.input_ids, roll.attention_mask, roll.prompt_len).float()
        t = ctx.config.temperature
        stats = metrics.token_stats(logits, mask=roll.mask, tokens=roll.completion, temperature=t,
                                    group_ids=torch.tensor(groups))
        top2 = torch.softmax(logits / t, dim=-1).topk(2, dim=-1).values
    margin = top2[..., 0] - top2[..., 1]
    valid = roll.mask.bool()
    h = stats.entropy[valid].double().numpy()      # each top:q rule's threshold, as the trainer takes it
    quantiles = {f"h_q{round(q * 100)}": ForkRule("top", q).threshold(h) for q in (0.1, 0.2, 0.3)}
    out = {}
    for i in range(roll.completion.shape[0]):
        n = int(valid[i].sum())
        out[base + i] = {"entropy_check": stats.entropy[i, :n].tolist(), "margin": margin[i, :n].tolist(),
                         "js": stats.js[i, :n].tolist() if stats.js is not None else [float("nan")] * n,
                         **quantiles}
    return out


def _one(job: tuple) -> tuple:
    """One run (in its own process): its record and its probed tokens with the study's columns."""
    model, strategy, which, lr, seed, args = job
    import tempfile

    import pandas as pd
    import torch

    torch.set_num_threads(1)
    import forksight.trainer.probe as trainer_probe
    from forksight.monitor.collector.store import Store
    from forksight.trainer.config import load_config
    from forksight.trainer.loop import train

    side: dict = {}
    probe_step, probe_eval = trainer_probe.probe_step, trainer_probe.probe_eval

    def step_and_record(ctx, step, batch, stats, selected):
        side[("train", step)] = _signals(ctx, batch.roll, batch.roll.group_ids.tolist(), 0)
        return probe_step(ctx, step, batch, stats, selected)

    def eval_and_record(ctx, step, roll, problems, n):
        side[("eval", step)] = _signals(ctx, roll, [i // n for i in range(roll.completion.shape[0])],
                                        trainer_probe.EVAL_SAMPLE_BASE)
        return probe_eval(ctx, step, roll, problems, n)

    trainer_probe.probe_step, trainer_probe.probe_eval = step_and_record, eval_and_record
    name = f"{strategy}-{which}-s{seed}"
    with tempfile.TemporaryDirectory(prefix="probes-") as tmp:
        db = f"{tmp}/{name}.duckdb"
        config = load_config(preset="readable", overrides=dict(
            model=model, warmup=False, strategy=strategy, lr=lr, seed=seed, steps=args.steps, run=name, db=db,
            out_dir=f"{tmp}/runs", progress=False, probe_every=args.every, probe_samples=args.samples,
            probe_k=args.k, probe_positions="all", probe_budget=1e9, reference_every=0, **STUDY,
            **PROBLEMS[args.problems]))
        started = time.perf_counter()
        result = train(config)
        seconds = time.perf_counter() - started
        with Store(db) as store:
            reader = store.reader
            scalars = reader.read_scalars(result.run_id, downsample=100_000)
            steps = reader.probe_steps(result.run_id)
            rows = pd.concat([reader.read_probes(result.run_id, s) for s in steps], ignore_index=True)
            alerts = reader.read_alerts(result.run_id)
    rows["split"] = rows["split"].fillna("train")
    rows = rows[rows.span.isna() | (rows.span == 1)].reset_index(drop=True)
    extra = pd.DataFrame([_extra(side, r) for r in rows.itertuples()])
    tokens = pd.concat([rows, extra], axis=1).assign(run=name, seed=seed, lr_of=which, strategy=strategy)
    drift = (tokens.entropy - tokens.entropy_check).abs().max()
    collapse = alerts[alerts.detector == "entropy_collapse"].step
    record = {"strategy": strategy, "lr_of": which, "lr": lr, "seed": seed, "seconds": round(seconds, 1),
              "probe_steps": steps, "collapse_alert_step": None if collapse.empty else int(collapse.min()),
              "entropy_recomputed_max_abs_diff": round(float(drift), 6),
              "continuations": int(scalars[scalars.key.str.endswith("probe/continuations")].value.sum()),
              "probe_seconds": round(float(scalars[scalars.key.str.endswith("probe/seconds")].value.sum()), 1),
              "reward_first_last": [_at(scalars, "reward/mean", 1), _at(scalars, "reward/mean", args.steps)],
              "heldout_pass1_last": _at(scalars, "eval/pass@1", args.steps)}
    print(f"{name}: {json.dumps(record)[:400]}", file=sys.stderr, flush=True)
    return record, tokens.drop(columns=["entropy_check", "alternatives"], errors="ignore")


def _extra(side: dict, row) -> dict:
    at = side[(row.split, int(row.step))][int(row.sample_id)]
    pos = int(row.pos)
    return {"js": at["js"][pos], "margin": at["margin"][pos], "entropy_check": at["entropy_check"][pos],
            **{k: v for k, v in at.items() if k.startswith("h_q")}}


def _at(scalars, key: str, step: int) -> float | None:
    hit = scalars[(scalars.key == key) & (scalars.step == step)].value
    return None if hit.empty else round(float(hit.iloc[0]), 4)


DISTINCT = "each distinct probed token once"
# what makes a probed token itself: the runs of one seed share weights, rollout and probe seed at
# step 1, so their first probes are the same tokens with the same values, which pooling must count once
IDENTITY = ("seed", "step", "sample_id", "pos", "token_id", "entropy", "v_before", "v_after")


def distinct(rows):
    """Each distinct probed token once (rows of several runs, each with its RL `seed`)."""
    return rows.drop_duplicates(subset=[c for c in IDENTITY if c in rows.columns], ignore_index=True)


def _pooled(rows) -> dict:
    """Over every probed token of the run (or of several): the base rate, forks, rho, tau sweep."""
    if rows.empty:
        return {}
    piv = rows.pivotal.astype(bool)
    h = rows.entropy.astype(float)
    out = {"probed_tokens": int(len(rows)), "pivotal_tokens": int(piv.sum()),
           "pivotal_frac": round(float(piv.mean()), 4),
           "delta_abs_mean": round(float(rows.delta.abs().mean()), 4)}
    known = rows.dropna(subset=["entropy"])
    if len(known) > 2 and known.delta.abs().nunique() > 1:
        out["spearman_entropy_delta"] = round(float(known.entropy.rank().corr(known.delta.abs().rank())), 4)
    for tau in TAUS:
        picked = h >= tau
        out[f"H>={tau}"] = {"share": round(float(picked.mean()), 4),
                            "precision": round(float(piv[picked].mean()), 4) if picked.any() else None,
                            "recall": round(float(picked[piv].mean()), 4) if piv.any() else None}
    return out


def slices(tokens, runs: list[dict], steps: int, window: int) -> dict:
    """Which probed tokens each reported figure reads: pooled, each phase, split, lr, and around collapse."""
    third = steps / 3
    out = {"pooled": tokens,
           "start": tokens[tokens.step <= third], "middle": tokens[(tokens.step > third) & (tokens.step <= 2 * third)],
           "end": tokens[tokens.step > 2 * third],
           "train": tokens[tokens.split == "train"], "eval": tokens[tokens.split == "eval"],
           "lr sweep": tokens[tokens.lr_of == "sweep"], "lr preset": tokens[tokens.lr_of == "preset"]}
    near = [(r["strategy"], r["lr_of"], r["seed"], r["collapse_alert_step"]) for r in runs
            if r["lr_of"] == "preset" and r["collapse_alert_step"] is not None]
    if near:
        import pandas as pd

        out["around collapse"] = pd.concat([tokens[(tokens.strategy == st) & (tokens.lr_of == lo) & (tokens.seed == sd)
                                                   & ((tokens.step - c).abs() <= window)] for st, lo, sd, c in near])
    return out


def _f(value, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ci(v: dict, key: str, digits: int = 3) -> str:
    ci = v.get(f"{key}_ci")
    return f"{_f(v.get(key), digits)} [{_f(ci[0], digits)}, {_f(ci[1], digits)}]" if ci else _f(v.get(key), digits)


def markdown(out: dict) -> str:
    """The JSON as the tables docs/probes.md shows (generated, never typed)."""
    m, study = out["meta"], out["study"]
    pooled = study["pooled"]
    lines = ["<!-- generated by bench/probes.py from its JSON; do not edit -->",
             f"{WORDS[m.get('problems', 'readable')][0].upper()}{WORDS[m.get('problems', 'readable')][1:]}, plain GRPO (`{m['strategies']}`), {m['steps']} steps at the sweep's lr and the "
             f"preset's, RL seeds {m['seeds']} ({m['warm_start']}); at step 1 and every {m['probe_every']} steps "
             f"{m['samples']} training completions (undecided groups first) and {m['samples']} held-out ones "
             f"probed at every position, K = {m['k']}; pivotal: {m['pivotal']}. Intervals: bootstrap 95% over "
             f"probed completions ({m['resamples']} resamples). Lift = precision / base rate of the same "
             "completions (a random pick's precision at any count).", "",
             f"**{pooled['pivotal_tokens']} pivotal tokens** in {pooled['tokens']:,} probed tokens of "
             f"{pooled['completions']} completions (base rate {pooled['base_rate']:.4f}).", "",
             f"**Verdict.** {out['verdict']}", "",
             "## Every rule on the same completions", "",
             "The rules as the product defines them, each picking its own share of tokens, then the ranked "
             "rules at one count per completion (10%, 20%, 30% of its tokens).", "",
             "| rule | share of tokens | precision | recall | lift over random | F1 |", "|---|---|---|---|---|---|"]
    for rule, v in pooled["rules"].items():
        lines.append(f"| `{rule}` | {_f(v['share'], 3)} | {_ci(v, 'precision')} | {_ci(v, 'recall')} | "
                     f"{_ci(v, 'lift', 2)} | {_ci(v, 'f1')} |")
    lines += ["", "## By phase, split, lr and around the collapse", "",
              "Lift over random [95% interval] of each rule at 20% of tokens per completion, and of the fork "
              "rules as defined.", ""]
    names = [r for r in pooled["rules"] if r.endswith("20%") or "%" not in r]
    lines += ["| slice | completions | pivots | " + " | ".join(f"`{r}`" for r in names) + " |",
              "|---|---|---|" + "---|" * len(names)]
    for where, v in study.items():
        if where == "pooled" or not v:
            continue
        lines.append(f"| {where} | {v['completions']} | {v['pivotal_tokens']} | " +
                     " | ".join(_ci(v["rules"][r], "lift", 2) if r in v["rules"] else "–" for r in names) + " |")
    lines += ["", "## The runs", "", "| run | lr | seconds | collapse alert at | continuations | probe s | "
              "reward first → last | held-out pass@1 at the end |", "|---|---|---|---|---|---|---|---|"]
    for r in out["runs"]:
        first, last = r["reward_first_last"]
        lines.append(f"| {r['strategy']} s{r['seed']} | {r['lr']:g} ({r['lr_of']}) | {r['seconds']} | "
                     f"{r['collapse_alert_step'] or '–'} | {r['continuations']:,} | {r['probe_seconds']} | "
                     f"{_f(first)} → {_f(last)} | {_f(r['heldout_pass1_last'])} |")
    lines += ["", "Pooled over every probed token: \"H ≥ τ\" as a detector of pivotal tokens.", "",
              "| τ | share of tokens | precision | recall |", "|---|---|---|---|"]
    for tau in TAUS:
        row = out["pooled"].get(f"H>={tau}", {})
        lines.append(f"| {tau} | {_f(row.get('share'), 3)} | {_f(row.get('precision'), 3)} | {_f(row.get('recall'), 3)} |")
    return "\n".join(lines) + "\n"


def _runner_up(rules: dict, winner: str, names: list[str], key: str) -> str:
    """`winner` against the next best of `names` by `key`: by how much, and whether their intervals part."""
    rest = sorted((r for r in names if r != winner and rules[r][key] is not None), key=lambda r: -rules[r][key])
    if not rest:
        return ""
    w, r = rules[winner], rules[rest[0]]
    if not (w.get(f"{key}_ci") and r.get(f"{key}_ci")):
        return f"; next `{rest[0]}` at {_f(r[key], 3)}"
    apart = w[f"{key}_ci"][0] > r[f"{key}_ci"][1]
    return (f"; next `{rest[0]}` at {_ci(r, key, 3)}: "
            + ("the intervals part" if apart else "the intervals overlap, so the two are not told apart"))


def verdict(pooled: dict) -> str:
    """What the pooled figures say, in words (the page's and the closing note's sentence)."""
    from probe_rules import best

    rules = pooled["rules"]
    equal, defined = best(pooled, "%"), best(pooled, "defined")
    beat = [r for r, v in rules.items() if v["lift_ci"] and v["lift_ci"][0] > 1 and not r.startswith("random")]
    lose = [r for r, v in rules.items() if v["lift_ci"] and v["lift_ci"][1] < 1 and not r.startswith("random")]
    e, d = rules[equal], rules[defined]
    at20 = [r for r in rules if r.endswith("20%")]
    as_defined = [r for r in rules if "%" not in r]
    return (f"At one count per completion (20%), `{equal}` ranks best: lift {_ci(e, 'lift', 2)}, recall "
            f"{_ci(e, 'recall', 2)}{_runner_up(rules, equal, at20, 'lift')}. Of the fork rules as defined, "
            f"`{defined}` has the best F1 ({_ci(d, 'f1', 3)}; precision {_ci(d, 'precision', 3)}, recall "
            f"{_ci(d, 'recall', 2)}){_runner_up(rules, defined, as_defined, 'f1')}. Beat random with an interval "
            f"above 1: {', '.join(f'`{r}`' for r in beat) or 'none'}. Worse than random with an interval below 1: "
            f"{', '.join(f'`{r}`' for r in lose) or 'none'}.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated RL seeds")
    parser.add_argument("--strategies", default="all", help="selection strategies trained (default: plain GRPO)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25, help="probe at step 1 and every N steps")
    parser.add_argument("--samples", type=int, default=4, help="training (and held-out) completions per probe")
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--problems", choices=sorted(PROBLEMS), default="steps3", help="what the runs train on")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--window", type=int, default=50, help="'around the collapse': steps either side")
    parser.add_argument("--tokens", default=None, help="also keep the probed tokens and the runs here (parquet "
                        "+ .runs.json), to score them again with --rescore")
    parser.add_argument("--rescore", default=None, metavar="TOKENS", help="score the tokens --tokens kept, "
                        "running nothing")
    add_page_options(parser, "docs/probes.md")
    args = parser.parse_args()
    if rendered_only(args, markdown):
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    import pandas as pd
    from probe_rules import pick_columns, score

    from forksight.trainer.config import PRESETS

    if args.rescore:
        tokens, runs = pd.read_parquet(args.rescore), json.loads(Path(args.rescore + ".runs.json").read_text())
    else:
        with open(REPO / "docs" / "strategies.json") as f:
            sweep_lr = json.load(f)["summary"]["readable"]
        model = warm_model() if args.problems == "readable" else steps3_model()
        jobs = [(model, strategy, which, sweep_lr[strategy]["lr"] if which == "sweep" else PRESETS["readable"]["lr"],
                 seed, args) for which in ("preset", "sweep") for strategy in args.strategies.split(",")
                for seed in (int(s) for s in args.seeds.split(","))]
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            done = list(pool.map(_one, jobs))
        runs = [record for record, _ in done]
        tokens = distinct(pd.concat([rows for _, rows in done], ignore_index=True))
        if args.tokens:
            tokens.to_parquet(args.tokens)
            Path(args.tokens + ".runs.json").write_text(json.dumps(runs))
    picked = pick_columns(tokens)
    study = {where: score(part, resamples=args.resamples) for where, part in
             slices(picked, runs, args.steps, args.window).items()}
    out = {"meta": {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "commit": commit(),
                    "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
                    "preset": "readable", "problems": args.problems, "strategies": args.strategies, "steps": args.steps,
                    "probe_every": args.every, "samples": args.samples, "k": args.k, "positions": "all",
                    "seeds": args.seeds, "warm_start": "seed-0 warm-up for every run", "resamples": args.resamples,
                    "pivotal": "|delta| >= 0.2 and |delta| > 2 SE", "pooled": DISTINCT, "window": args.window,
                    "study": STUDY},
           "verdict": verdict(study["pooled"]), "study": study, "pooled": _pooled(tokens), "runs": runs}
    write_outputs(out, args, markdown, echo=not args.out)       # the JSON to stdout unless --out


if __name__ == "__main__":
    main()
