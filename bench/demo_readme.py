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

import marked_block

BEGIN, END = "<!-- demo:begin -->", "<!-- demo:end -->"
DEFAULT = Path(__file__).parent.parent / "docs" / "demo.json"


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


def paragraph(summary: dict, source: str = "docs/demo.json") -> str:
    """The block's Markdown: the demo's setup, one bullet per run, its time."""
    meta, runs = summary["meta"], summary["runs"]
    lines = [f"`make demo` trains {len(runs)} runs side by side on the `{meta['preset']}` preset, seed "
             f"{meta['seed']}, {meta['steps']} steps each, held-out pass@k at step 0 and every "
             f"{meta['eval_every']} steps. Its closing summary on {meta['machine']} ({meta['date'][:10]}; "
             f"`{source}`, written into this paragraph by `python bench/demo_readme.py`):", ""]
    lines += [run_line(run) for run in runs]
    if meta.get("train_seconds") is not None:
        lines += ["", f"All {len(runs)} runs took {meta['train_seconds']:.0f} s after the model was ready "
                      f"({meta.get('prepare_seconds', 0):.0f} s here with the warm-up cached; the first "
                      f"`make demo` warms it up once)."]
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
    text = paragraph(json.loads(path.read_text()))
    if args.readme:
        rewrite(Path(args.readme), text)
        print(f"rewrote the demo block of {args.readme}", file=sys.stderr)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
