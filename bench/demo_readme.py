"""The README's demo paragraph, generated from `forksight demo`'s summary JSON (never typed by hand).

    python bench/demo_readme.py                                    # print it from docs/demo.json
    python bench/demo_readme.py docs/demo.json --readme README.md  # rewrite the marked block

docs/demo.json is the summary of a real run: `forksight demo --exit-when-done --summary
docs/demo.json` on a fresh --db file. --readme replaces what lies between `<!-- demo:begin -->`
and `<!-- demo:end -->`, and nothing else.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import kernel_spread
import marked_block

BEGIN, END = "<!-- demo:begin -->", "<!-- demo:end -->"
DEFAULT = Path(__file__).parent.parent / "docs" / "demo.json"
SPREAD = Path(__file__).parent.parent / "docs" / "kernel_spread.json"


def _f(x: float | None, digits: int = 2) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _heldout(run: dict) -> str:
    held = run["heldout"]
    if not held:
        return "no held-out evaluation"
    top = max(held, key=lambda k: int(k.split("@")[1]))
    parts = [f"{k} {_f(held[k]['first'])} → {_f(held[k]['last'])}" for k in dict.fromkeys(("pass@1", top))
             if k in held]
    return f"held-out {', '.join(parts)} (base model at step {held[top]['first_step']}, last at step {held[top]['last_step']})"


def _collapse(run: dict) -> str:
    warned, under, critical = run["warning_step"], run["under_20pct_step"], run["critical_step"]
    if under is None and warned is None:
        return "no collapse warning, and entropy never under 20% of its start"
    if under is None:
        return f"a collapse warning at step {warned}, but entropy never under 20% of its start"
    text = f"entropy fell under 20% of its start at step {under}"
    if warned is None:
        text += ", with no collapse warning before it"
    elif run["warning_lead"] >= 0:
        text = (f"forksight warned of collapse at step {warned}, {run['warning_lead']} steps before "
                f"entropy fell under 20% of its start (step {under})")
    else:
        text += f", warned only at step {warned}"
    return text + (f"; the alert went critical (entropy under its floor) at step {critical}"
                   if critical is not None else "")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.{1 if 100 * x >= 1 else 2}f}%"


def run_line(run: dict) -> str:
    """One bullet: what the run shows, every figure from the summary."""
    share = run.get("entropy_end_share")
    return (f"- **{run['label']}** — {run['why_text']}. Entropy {_f(run['entropy_start'], 3)} → "
            f"{_f(run['entropy_end'], 3)} nats per token ({_f(None if share is None else 100 * share, 0)}% of "
            f"its start); {_collapse(run)}. Train reward {_f(run['reward_start'])} → {_f(run['reward_end'])}; "
            f"{_heldout(run)}; fork tokens {_pct(run['fork_frac_start'])} → {_pct(run['fork_frac_end'])} "
            f"of tokens. Verdict: *{run['verdict']['label']}*: {run['verdict']['why']}.")


def _range(fig: dict, unit: str = "", digits: int | None = None, never: bool = True) -> str:
    """`a–b` (or `a` when they agree) from a spread entry; ' (never in N)' when some cells lacked it."""
    lo, hi = fig["min"], fig["max"]
    if lo is None:
        return "never"
    show = (lambda x: f"{x:.{digits}f}") if digits is not None else str
    text = show(lo) if show(lo) == show(hi) else f"{show(lo)}–{show(hi)}"
    return text + unit + (f" (never in {fig['never']})" if fig["never"] and never else "")


def spread_lines(spread: dict, source: str = "docs/kernel_spread.json") -> list[str]:
    """What varies by machine, as ranges: the demo's two plain-GRPO runs over kernel paths × seeds."""
    meta, cells = spread["meta"], spread["cells"]
    paths = list(dict.fromkeys(c["variant"] for c in cells))
    seeds = sorted({c["seed"] for c in cells})
    common, swept = spread["spread"][kernel_spread.COMMON], spread["spread"][kernel_spread.SWEPT]
    quiet = sum(c["runs"][kernel_spread.SWEPT]["warning_step"] is None for c in cells)
    warned_seeds = sorted({c["seed"] for c in cells if c["runs"][kernel_spread.SWEPT]["warning_step"] is not None})
    return ["", f"Other CPUs round differently, so from the same shipped base model the runs differ by machine. "
                f"Across {len(paths)} CPU kernel paths ({', '.join(paths)}) × seeds {', '.join(map(str, seeds))}, "
                f"{meta['steps']} steps (`{source}`, `python bench/kernel_spread.py`), plain GRPO at the common lr "
                f"starts at entropy {_range(common['entropy_start'], digits=3)}, is warned of collapse at step "
                f"{_range(common['warning_step'])}, falls under 20% of its start at step "
                f"{_range(common['under_20pct_step'])} (warned {_range(common['warning_lead'])} steps ahead), goes "
                f"critical at step {_range(common['critical_step'])}, and ends at held-out pass@8 "
                f"{_range(common['eval_pass8_last'], digits=2)}. At the sweep's lr entropy " + (
                "never falls under 20% of its start" if swept["under_20pct_step"]["min"] is None else
                f"falls under 20% of its start in {len(cells) - swept['under_20pct_step']['never']} of {len(cells)} cells")
                + f" and held-out pass@8 ends at {_range(swept['eval_pass8_last'], digits=2)}; it goes "
                f"unwarned in {quiet} of {len(cells)} cells" + (
                f", and where it is warned (seed {', '.join(map(str, warned_seeds))}), at step "
                f"{_range(swept['warning_step'], never=False)}, after the common lr has collapsed. " if warned_seeds else ". ") +
                f"Every cell keeps the claims the tests assert: {'yes' if spread['all_hold'] else 'NO'}."]


def paragraph(summary: dict, source: str = "docs/demo.json", spread: dict | None = None) -> str:
    """The block's Markdown: the demo's setup, one bullet per run, its time, and (given the
    kernel-level spread) the range of the figures that vary by machine."""
    meta, runs = summary["meta"], summary["runs"]
    lines = [f"`make demo` trains {len(runs)} runs side by side on the `{meta['preset']}` preset, seed "
             f"{meta['seed']}, {meta['steps']} steps each, held-out pass@k at step 0 and every "
             f"{meta['eval_every']} steps. Its closing summary on {meta['machine']}"
             f"{', ' + meta['cpu_capability'] + ' kernels' if meta.get('cpu_capability') else ''} ({meta['date'][:10]}; "
             f"`{source}`, written into this paragraph by `python bench/demo_readme.py`):", ""]
    lines += [run_line(run) for run in runs]
    if meta.get("train_seconds") is not None:
        lines += ["", f"All {len(runs)} runs took {meta['train_seconds']:.0f} s after the model was ready "
                      f"(preparing it took {meta.get('prepare_seconds', 0):.0f} s: the shipped base model and "
                      f"warm-up, copied into the cache the first time)."]
    if spread is not None:
        lines += spread_lines(spread)
    return "\n".join(lines) + "\n"


def block(content: str) -> str | None:
    """What lies between the demo markers of a README's text (None: not there once, in order)."""
    return marked_block.block(content, BEGIN, END)


def rewrite(readme: Path, text: str) -> None:
    """Replace the demo block's content with `text`; the markers must be there, once."""
    marked_block.rewrite(readme, text, BEGIN, END)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="?", default=str(DEFAULT), help="the demo's summary (docs/demo.json)")
    parser.add_argument("--readme", help="rewrite the marked block of this file instead of printing")
    args = parser.parse_args(argv)
    path = Path(args.json)
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run `forksight demo --exit-when-done --summary {path}` first")
    spread = json.loads(SPREAD.read_text()) if SPREAD.exists() else None
    text = paragraph(json.loads(path.read_text()), spread=spread)
    if args.readme:
        rewrite(Path(args.readme), text)
        print(f"rewrote the demo block of {args.readme}", file=sys.stderr)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
