"""`forksight probe`: Monte-Carlo value probes of a stored run's step, offline (any run in a store:
bundled, TRL, verl, imported). The completions are rebuilt from their STORED token ids, the prompt
from its stored text with the model's tokenizer; the reward is the user's fn(prompt, completion)
-> float. Rows go to the run's `probes` table, `probe/*` scalars beside the step's others. Bad input
(reward missing, raising or not a number; K < 1; unknown run or step; ids another tokenizer wrote)
exits non-zero naming it, with nothing written."""
from __future__ import annotations

import argparse
import json
import random
import sys
import uuid
from typing import Any, Callable

from forksight.compose.probe_source import ProbeInputError, add_run_source, open_source, reported

# the run's completion length cap as each producer stores it: the bundled trainer, TRL, verl
CAP_KEYS = ("max_new_tokens", "max_completion_length", "max_response_length")


def completion_cap(config: dict) -> int | None:
    """The stored run's completion length cap (the continuations' length), None when it has none."""
    for key in CAP_KEYS:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1:
            return int(value)
    return None


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("probe", help="Monte-Carlo value probes of a stored step (which tokens decide "
                              "the reward; are the forks those?).",
                              description="V(x, y<t) and V(x, y<=t) of tokens of N stored completions of one "
                                          "step, each the mean reward of K continuations of --model "
                                          "(docs/algorithms.md, value probes).")
    add_run_source(p)
    p.add_argument("--step", type=int, default=None, help="the step whose completions are probed")
    p.add_argument("--model", default=None, metavar="HF_DIR", help="the policy (a local HF causal LM)")
    p.add_argument("--reward", default=None, metavar="MODULE:FUNCTION",
                   help="fn(prompt: str, completion: str) -> float; MODULE dotted or a path to a .py file")
    p.add_argument("--calibrate", action="store_true",
                   help="probe nothing: from the run's stored probes, the fork rule (abs:τ and top:q) with the "
                        "best F1 against its pivotal tokens, with bootstrap intervals")
    p.add_argument("--store", action="store_true", help="--calibrate: make the best rule the run's fork_rule")
    p.add_argument("--format", choices=("text", "json"), default="text", help="--calibrate's output")
    p.add_argument("--samples", type=int, default=8, help="completions probed (default 8)")
    p.add_argument("--positions", default="auto",
                   help="auto (default: search for completions longer than --search-above tokens, forks for "
                        "shorter), forks, all, search (bisection: about log2 T values per pivot), or N random "
                        "per completion")
    p.add_argument("--search-above", type=int, default=32,
                   help="auto: completions longer than this many tokens are searched by bisection (default 32)")
    p.add_argument("--k", type=int, default=16, help="continuations per value (default 16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=None, help="default: the run's, else 1.0")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="completion length cap; default: the run's, else the longest stored completion")
    p.add_argument("--chat", action="store_true", help="the run applied the tokenizer's chat template: stored "
                   "'role: content' prompt lines are turned back into messages")
    p.add_argument("--pivot-delta", type=float, default=0.2, help="pivotal: |delta| >= this (default 0.2)")
    p.add_argument("--pivot-se", type=float, default=2.0, help="... and > this many SE (default 2)")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=run)


def load_reward(spec: str) -> Callable[[str, str], Any]:
    """MODULE:FUNCTION -> the function; MODULE is a dotted name or a .py path."""
    import importlib
    import importlib.util
    import os

    module_name, _, name = spec.rpartition(":")
    if not module_name or not name:
        raise ProbeInputError(f"--reward {spec!r} must be MODULE:FUNCTION (e.g. my_rewards:exact_match "
                              "or path/to/rewards.py:exact_match)")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            if not os.path.exists(module_name):
                raise ProbeInputError(f"--reward: no file {module_name}")
            loader = importlib.util.spec_from_file_location(f"_forksight_reward_{uuid.uuid4().hex}", module_name)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except ProbeInputError:
        raise
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's module's
        raise ProbeInputError(f"--reward: importing {module_name} failed ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, name, None)
    if fn is None:
        raise ProbeInputError(f"--reward: {module_name} has no function {name!r}")
    if not callable(fn):
        raise ProbeInputError(f"--reward: {module_name}.{name} is not a function")
    return fn


def prompt_ids(tokenizer, text: str, chat: bool) -> list[int]:
    if not chat:
        return tokenizer(text).input_ids
    messages = []
    for line in text.split("\n"):
        role, sep, content = line.partition(": ")
        if sep and role in ("system", "user", "assistant", "tool"):
            messages.append({"role": role, "content": content})
        elif messages:
            messages[-1]["content"] += "\n" + line
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))


def check_tokens(tokenizer, rows: list[dict], what: str = "--model") -> None:
    """The stored token texts must be what this tokenizer makes of the stored ids (`what`: whose tokenizer)."""
    pairs = [(r["token_id"], r["token"]) for r in rows if r.get("token") is not None][:200]
    wrong = [(i, t) for i, t in pairs if tokenizer.decode([i]) != t]
    if pairs and len(wrong) > len(pairs) // 5:
        i, t = wrong[0]
        raise ProbeInputError(f"{what}'s tokenizer does not match the run's: it decodes stored token id {i} as "
                              f"{tokenizer.decode([i])!r}, the run stored {t!r} ({len(wrong)} of {len(pairs)} "
                              "checked differ); use the run's model or one with its tokenizer")


def run(args: argparse.Namespace) -> int:
    return reported("probe", lambda: _dispatch(args))


def _dispatch(args: argparse.Namespace) -> int:
    if args.calibrate:
        return _calibrate(args, open_source(args))
    if args.store:
        raise ProbeInputError("--store goes with --calibrate (it stores the calibrated fork rule)")
    missing = [flag for flag, value in (("--step", args.step), ("--model", args.model),
                                        ("--reward", args.reward)) if value is None]
    if missing:
        raise ProbeInputError(f"probing needs {', '.join(missing)} (or --calibrate, which reads stored probes)")
    return _run(args, open_source(args))


def _calibrate(args: argparse.Namespace, source) -> int:
    from forksight.hooks.metrics.probe_calibrate import calibrate

    with source:
        config = source.run_config(args.run)
        rows = source.probe_rows(args.run)
        if not rows:
            raise ProbeInputError(f"run {args.run!r} has no value probes to calibrate from: probe it first "
                                  "(forksight probe --positions all, or train with --probe-every N); nothing written")
        try:
            out = {"run": args.run, **calibrate(rows)}
        except ValueError as exc:
            raise ProbeInputError(f"run {args.run!r}: {exc}; nothing written") from None
        if args.store:
            source.set_config(args.run, {**config, "fork_rule": out["best"]})
            out["stored"] = out["best"]
    if args.format == "json":
        print(json.dumps(out))
    else:
        for key, rule in (("tau", "abs"), ("q", "top")):
            r = out[key]
            print(f"{rule}:{r['value']:g}  F1 {r['f1']:.3f} (precision {r['precision']:.3f}, recall {r['recall']:.3f})"
                  f"  95% interval {r['interval']}")
        print(f"best: {out['best']} over {out['pivots']} pivotal of {out['tokens']} probed tokens in "
              f"{out['completions']} completions" + (f"; stored as the run's fork_rule" if args.store else ""))
    return 0


def _run(args: argparse.Namespace, source) -> int:
    from tqdm.auto import tqdm

    from forksight.hooks.metrics.probe_stats import TokenSignals, one_token, probe_scalars
    from forksight.hooks.metrics.value_probe import ProbeInput, ProbeSettings, RewardError, probe, stop_ids

    with source:
        fn = load_reward(args.reward)
        config = source.run_config(args.run)
        samples = {int(r["sample_id"]): r for r in source.samples(args.run, args.step)}
        tokens: dict[int, list[dict]] = {}
        for row in source.tokens(args.run, args.step):
            tokens.setdefault(int(row["sample_id"]), []).append(row)
        usable = sorted(s for s in tokens if s in samples and not any(r.get("env") for r in tokens[s]))
        if not usable:
            raise ProbeInputError(f"run {args.run!r} has no stored completion with token ids at step {args.step}"
                                  f" ({len(samples)} sample row(s), {len(tokens)} with token rows); steps with "
                                  f"token rows: {source.token_steps_hint(args.run)}")
        positions = int(args.positions) if str(args.positions).isdigit() else args.positions
        max_len = max(len(rows) for rows in tokens.values())
        settings = ProbeSettings(
            k=args.k, positions=positions, seed=args.seed, search_above=args.search_above,
            temperature=args.temperature or float(config.get("temperature") or 1.0),
            max_new_tokens=args.max_new_tokens or completion_cap(config) or max_len,
            first_token_eos="max_new_tokens" not in config,       # the bundled trainer samples min_new_tokens=1
            pivot_delta=args.pivot_delta, pivot_se=args.pivot_se)
        try:
            settings.check()
        except ValueError as exc:
            raise ProbeInputError(str(exc)) from None
        if args.samples < 1:
            raise ProbeInputError(f"--samples must be >= 1, got {args.samples}")
        picked = sorted(random.Random(args.seed).sample(usable, min(args.samples, len(usable))))
        from forksight.trainer.model import load

        model, tokenizer = load(args.model)
        model.to(args.device)
        rows_of = {s: sorted(tokens[s], key=lambda r: r["pos"]) for s in picked}
        check_tokens(tokenizer, [r for s in picked for r in rows_of[s]])
        inputs, signals, prompts = [], [], []
        for s in picked:
            rows = rows_of[s]
            if any(r["token_id"] is None for r in rows):
                raise ProbeInputError(f"sample {s} of step {args.step} has token rows without token_id")
            entropy = [r.get("entropy") for r in rows]
            fork = [r.get("fork") for r in rows]
            inputs.append(ProbeInput(s, prompt_ids(tokenizer, samples[s]["prompt"] or "", args.chat),
                                     [int(r["token_id"]) for r in rows],
                                     entropy=None if any(h is None for h in entropy) else entropy,
                                     fork=None if any(f is None for f in fork) else fork))
            selected = [r.get("selected") for r in rows]
            signals.append(TokenSignals(s, entropy, [r.get("js") for r in rows],
                                        None if any(x is None for x in selected) else selected))
            prompts.append(samples[s]["prompt"] or "")

        def reward(i: int, ids: list[int]) -> float:
            return fn(prompts[i], tokenizer.decode(ids, skip_special_tokens=True))

        bar = tqdm(desc=f"probing {len(inputs)} completion(s) of step {args.step}", unit="value", file=sys.stderr)
        import time

        start, counts = time.perf_counter(), {}
        try:
            rows = probe(model, inputs, reward, settings, eos_id=stop_ids(model, tokenizer),
                         pad_id=tokenizer.pad_token_id, decode=lambda t: tokenizer.decode([t]), progress=bar,
                         counts=counts)
        except RewardError as exc:
            raise ProbeInputError(f"--reward {args.reward}: {exc}; nothing was written") from None
        finally:
            bar.close()
        scalars = probe_scalars(rows, signals, len(inputs), seed=args.seed)
        scalars["probe/seconds"] = time.perf_counter() - start
        scalars["probe/continuations"] = float(counts["continuations"])
        source.write(args.run, args.step, rows, scalars)
        print(json.dumps({"run": args.run, "step": args.step, "completions": len(inputs),
                          "positions": sum(one_token(r) for r in rows), "segments": sum(not one_token(r) for r in rows),
                          "continuations": counts["continuations"],
                          "max_new_tokens": settings.max_new_tokens, "temperature": settings.temperature,
                          "scalars": {k: round(v, 5) for k, v in scalars.items()}}))
    return 0
