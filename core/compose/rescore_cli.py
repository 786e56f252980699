"""`forksight rescore`: a stored run's reference set re-scored, teacher-forced, by each of its checkpoints
(issue 48 item 2) — how a run that trained without forksight gets the entropy-pattern analysis: `forksight
import` its logs, then `rescore` its checkpoints. The set is the run's own (its base step's rows) or,
for a run without one, the stored completions of `--from-step` (their stored statistics are the base).
Rows go to the run's `reference` table, ref/* scalars at each checkpoint's step. Everything is checked
before anything is written: an unknown run, a folder with no checkpoint, a checkpoint whose step cannot
be told or whose vocabulary cannot hold the stored ids, a run with neither a set nor --from-step.

Steps: the reference rows at step k are the policy after k optimiser updates (as TRL's checkpoint-k and
the trainers' own re-scoring); the token rows of step S were scored by the policy before step S's
update, so --from-step S's base is stored at step S − 1."""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from forksight.compose.probe_source import ProbeInputError, add_run_source, open_source, reported

CHECKPOINT_DIR = re.compile(r"checkpoint-(\d+)")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("rescore", help="Re-score a run's reference set with its checkpoints (how RL "
                              "reshaped the forks, for a run trained anywhere).",
                              description="Teacher-forced H, H2 and log p of the run's reference set under "
                                          "each checkpoint, stored as the run's reference rows and ref/* "
                                          "scalars at the checkpoint's step (docs/algorithms.md §15).")
    add_run_source(p)
    p.add_argument("--checkpoints", nargs="+", required=True, metavar="DIR",
                   help="HF model folders (config.json + weights), folders of TRL's checkpoint-N, or the "
                        "bundled trainer's out_dir/<run> (checkpoint.pt); in step order from trainer_state.json "
                        "or the folder name")
    p.add_argument("--from-step", type=int, default=None,
                   help="a run without a reference set: use the stored completions of step S as the set; their "
                        "stored statistics are the base, at step S − 1 (the policy that sampled them)")
    p.add_argument("--size", type=int, default=32, help="--from-step: at most this many completions (default 32)")
    p.add_argument("--tokenizer", default=None, metavar="HF_DIR",
                   help="--from-step: the tokenizer of the run's prompts (default: the first checkpoint's)")
    p.add_argument("--chat", action="store_true", help="--from-step: the run applied the tokenizer's chat "
                   "template: stored 'role: content' prompt lines are turned back into messages")
    p.add_argument("--temperature", type=float, default=None, help="default: the run's, else 1.0")
    p.add_argument("--fork-rule", default=None, help="default: the run's (abs:τ or top:q)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return reported("rescore", lambda: _run(args, open_source(args)))


# ---------------------------------------------------------------------------- checkpoints
def _step_of(folder: Path) -> int:
    state = folder / "trainer_state.json"
    if state.exists():
        try:
            return int(json.loads(state.read_text())["global_step"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ProbeInputError(f"--checkpoints: {state} has no readable global_step ({exc})") from None
    match = CHECKPOINT_DIR.fullmatch(folder.name)
    if match is None:
        raise ProbeInputError(f"--checkpoints: cannot tell the training step of {folder}: name it checkpoint-N "
                              "or keep TRL's trainer_state.json beside its weights")
    return int(match.group(1))


def _pt_step(path: Path) -> int:
    import torch

    try:
        return int(torch.load(path, map_location="cpu", weights_only=False)["step"])
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise ProbeInputError(f"--checkpoints: {path} is not a forksight checkpoint ({type(exc).__name__})") from None


def find_checkpoints(paths: list[str]) -> list[tuple[int, Path]]:
    """(step, checkpoint) pairs in step order; a folder with none, a step told twice: an error."""
    found: list[tuple[int, Path]] = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise ProbeInputError(f"--checkpoints: no such file or folder {path}")
        if path.is_file() and path.suffix == ".pt":
            found.append((_pt_step(path), path))
        elif (path / "config.json").exists():
            found.append((_step_of(path), path))
        elif inner := sorted(d for d in path.iterdir() if d.is_dir() and CHECKPOINT_DIR.fullmatch(d.name)
                             and (d / "config.json").exists()):
            found += [(_step_of(d), d) for d in inner]
        elif (path / "checkpoint.pt").exists():
            found.append((_pt_step(path / "checkpoint.pt"), path / "checkpoint.pt"))
        else:
            raise ProbeInputError(f"--checkpoints: {path} holds no checkpoint (a folder with config.json and "
                                  "weights, TRL's checkpoint-N folders, or the bundled trainer's checkpoint.pt)")
    steps = [s for s, _ in found]
    twice = sorted({s for s in steps if steps.count(s) > 1})
    if twice:
        raise ProbeInputError(f"--checkpoints: more than one checkpoint of step(s) {twice}: give each step once")
    return sorted(found)


def _model_dir(checkpoint: Path) -> Path:
    """The HF folder a checkpoint's architecture and tokenizer come from (.pt: the base it was trained from)."""
    if checkpoint.suffix != ".pt":
        return checkpoint
    import torch

    base = torch.load(checkpoint, map_location="cpu", weights_only=False).get("model_path")
    if not base or not Path(base).exists():
        raise ProbeInputError(f"--checkpoints: {checkpoint} names its base model {base!r}, which is not here")
    return Path(base)


def _vocab_of(checkpoint: Path) -> int | None:
    try:
        return json.loads((_model_dir(checkpoint) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        return None


def load_model(checkpoint: Path, device: str):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(_model_dir(checkpoint)), dtype=torch.float32)
    if checkpoint.suffix == ".pt":
        model.load_state_dict(torch.load(checkpoint, map_location="cpu", weights_only=False)["model"])
    return model.to(device).eval()


# ---------------------------------------------------------------------------- the set
def _set_of_step(args, source, checkpoint: Path):
    """The reference set and its base scoring from the stored completions of --from-step, and the base rows."""
    import numpy as np
    from transformers import AutoTokenizer

    from forksight.compose.probe_cli import check_tokens, prompt_ids
    from forksight.hooks.metrics.reference import ReferenceSet, Scored

    samples = {int(r["sample_id"]): r for r in source.samples(args.run, args.from_step)}
    tokens: dict[int, list[dict]] = {}
    for row in source.tokens(args.run, args.from_step):
        tokens.setdefault(int(row["sample_id"]), []).append(row)
    usable = sorted(s for s in tokens if s in samples and not any(r.get("env") for r in tokens[s]))[:args.size]
    if not usable:
        raise ProbeInputError(f"run {args.run!r} has no stored completion with token ids at step {args.from_step}; "
                              f"steps with token rows: {source.token_steps_hint(args.run)}; nothing written")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or str(_model_dir(checkpoint)))
    rows = {s: sorted(tokens[s], key=lambda r: r["pos"]) for s in usable}
    check_tokens(tokenizer, [r for s in usable for r in rows[s]], what="the checkpoint" if not args.tokenizer
                 else "--tokenizer")
    ref = ReferenceSet([prompt_ids(tokenizer, samples[s]["prompt"] or "", args.chat) for s in usable],
                       [[int(r["token_id"]) for r in rows[s]] for s in usable])
    value = lambda r, k: np.nan if r.get(k) is None else float(r[k])  # noqa: E731
    base = Scored(*[[np.array([value(r, k) for r in rows[s]]) for s in usable] for k in ("entropy", "renyi2", "logp")])
    return ref, base, {int(t): tokenizer.decode([int(t)]) for ids in (*ref.prompts, *ref.completions) for t in ids}


def _base_rows(source, run: str, stored: list[int]) -> tuple[int, list[dict]]:
    """The base step (the one whose rows hold the prompts; usually the first) and its rows."""
    for step in stored:
        rows = source.reference(run, step)
        if any(int(r["pos"]) < 0 for r in rows):
            return step, rows
    raise ProbeInputError(f"run {run!r}: no stored reference step holds the set's prompts (steps {stored}); "
                          "the set cannot be rebuilt; nothing written")


class _Rows:
    """A sink for one ReferenceScorer call: keeps the rows and scalars to write in one batch."""

    def __init__(self):
        self.rows, self.scalars = [], {}

    def log_reference(self, step, rows):
        self.rows = list(rows)

    def log_scalars(self, step, values, weight=None):
        self.scalars.update(values)


def _run(args: argparse.Namespace, source) -> int:
    from tqdm.auto import tqdm

    from forksight.base.fork_rule import ForkRule, recorded
    from forksight.hooks.capture.reference import ReferenceScorer, set_from_rows
    from forksight.hooks.metrics.reference import pattern_scalars

    if args.size < 1:
        raise ProbeInputError(f"--size must be >= 1, got {args.size}")
    with source:
        config = source.run_config(args.run)
        try:
            rule = ForkRule.parse(args.fork_rule) if args.fork_rule else recorded(config.get("fork_rule"))
        except ValueError as exc:
            raise ProbeInputError(str(exc)) from None
        temperature = args.temperature or float(config.get("temperature") or 1.0)
        found = find_checkpoints(args.checkpoints)
        stored = source.reference_steps(args.run)
        base_rows = None
        if stored:
            base_step, stored_rows = _base_rows(source, args.run, stored)
            if args.from_step is not None:
                raise ProbeInputError(f"run {args.run!r} already has a reference set (its base at step {base_step}): "
                                      "rescore it without --from-step; a run's set is never replaced; nothing written")
            ref, base = set_from_rows(stored_rows)
            names = {int(r["token_id"]): r.get("token") for r in stored_rows}
        elif args.from_step is not None:
            if args.from_step < 1:
                raise ProbeInputError(f"--from-step must be a trained step (>= 1), got {args.from_step}")
            # step S's completions were sampled and scored by the policy after S − 1 updates, which is
            # what a checkpoint-(S − 1) holds: their stored statistics are the base, at step S − 1
            base_step = args.from_step - 1
            ref, base, names = _set_of_step(args, source, found[0][1])
            base_rows = True
        else:
            raise ProbeInputError(f"run {args.run!r} has no reference set: give --from-step S to use the stored "
                                  f"completions of step S (steps with token rows: {source.token_steps_hint(args.run)}); "
                                  "nothing written")
        for step, checkpoint in found:                   # every checkpoint can hold the set: checked first
            vocab = _vocab_of(checkpoint)
            if vocab is not None and ref.max_id >= vocab:
                raise ProbeInputError(f"checkpoint {checkpoint} (step {step}) has a vocabulary of {vocab}, the "
                                      f"reference set holds token id {ref.max_id}: it was trained with another "
                                      "tokenizer than the run's; nothing written")
        scorer = ReferenceScorer(_Rows(), ref, fork_rule=rule, temperature=temperature, decode=names.get,
                                 budget=None, base=base.with_forks(rule))
        summary = []
        if base_rows:
            source.write(args.run, base_step, scorer.rows(base, prompts=True), pattern_scalars(base, base),
                         table="reference")
        for step, checkpoint in tqdm(found, desc=f"rescore {args.run}", unit="checkpoint"):
            if step in stored or (base_rows and step == base_step):
                summary.append({"step": step, "checkpoint": str(checkpoint),
                                "skipped": "already scored" if step in stored else "the base (its stored statistics)"})
                continue
            scorer.sink = _Rows()
            try:
                scalars = scorer.rescore(load_model(checkpoint, args.device), step)
            except ValueError as exc:
                raise ProbeInputError(f"checkpoint {checkpoint}: {exc}") from None
            source.write(args.run, step, scorer.sink.rows, scorer.sink.scalars, table="reference")
            summary.append({"step": step, "checkpoint": str(checkpoint),
                            **{k: scalars.get(k) for k in ("ref/fork_overlap", "ref/fork_jaccard", "ref/spearman",
                                                           "ref/dh/mean", "ref/logp/mean")}})
    out = {"run": args.run, "base_step": base_step, "completions": len(ref), "tokens": int(sum(map(len, ref.completions))),
           "fork_rule": str(rule), "checkpoints": summary}
    if args.format == "json":
        print(json.dumps(out))
    else:
        print(f"{args.run}: {out['completions']} reference completions ({out['tokens']} tokens), base step "
              f"{base_step}, fork rule {rule}")
        for row in summary:
            if "skipped" in row:
                print(f"  step {row['step']}: {row['skipped']}")
            else:
                print(f"  step {row['step']}: fork overlap {_num(row['ref/fork_overlap'])}, Spearman ρ "
                      f"{_num(row['ref/spearman'])}, mean |ΔH| {_num(row['ref/dh/mean'], 4)}, "
                      f"log p {_num(row['ref/logp/mean'])}")
    return 0


def _num(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"
