"""README's demo paragraph is bench/demo_readme.py's output from the committed docs/demo.json (the
summary of a real `forksight demo` run), and that summary shows the demo's point: plain GRPO at the
common lr collapses, warned at least 10 steps before entropy fell under 20% of its start; at the
sweep's lr it stays healthy; fork and ict ran beside them; held-out pass@k was measured."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import demo_readme  # noqa: E402
import kernel_spread  # noqa: E402

SUMMARY = json.loads((ROOT / "docs" / "demo.json").read_text())
SPREAD = json.loads((ROOT / "docs" / "kernel_spread.json").read_text())


def test_the_readme_block_is_the_generators_output_from_the_committed_summary():
    block = demo_readme.block((ROOT / "README.md").read_text())
    assert block is not None, "README.md needs the <!-- demo:begin --> / <!-- demo:end --> markers"
    assert block == demo_readme.paragraph(SUMMARY, spread=SPREAD), (
        "README's demo block is stale: run `python bench/demo_readme.py docs/demo.json --readme README.md`")


def test_rewrite_replaces_only_the_marked_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{demo_readme.BEGIN}\nold\n{demo_readme.END}\nafter\n")
    demo_readme.rewrite(readme, "new text\n")
    assert readme.read_text() == f"before\n{demo_readme.BEGIN}\nnew text\n{demo_readme.END}\nafter\n"


def _run(label_start: str) -> dict:
    return next(r for r in SUMMARY["runs"] if r["label"].startswith(label_start))


def test_the_committed_summary_shows_a_warned_collapse_beside_a_healthy_run():
    common, swept = _run("all · lr 5e-4 (common)"), _run("all · lr 5.56e-5 (sweep's best)")
    assert {r["strategy"] for r in SUMMARY["runs"]} == {"all", "fork", "ict"}
    # collapse at the common lr, warned ahead: the lead recomputed from the steps themselves
    assert common["under_20pct_step"] is not None and common["warning_step"] is not None
    assert common["under_20pct_step"] - common["warning_step"] == common["warning_lead"] >= 10
    assert common["entropy_end"] < 0.2 * common["entropy_start"]
    assert common["verdict"]["state"] == "collapsed"
    # at the sweep's lr: no collapse warning, entropy never under 20% of its start
    assert swept["warning_step"] is None and swept["under_20pct_step"] is None
    assert swept["entropy_end"] > 0.2 * swept["entropy_start"]
    # the cost of collapse on held-out problems: the base model (step 0) against the last evaluation
    for run in SUMMARY["runs"]:
        assert run["heldout"]["pass@8"]["first_step"] == 0 and run["heldout"]["pass@8"]["last_step"] == run["steps"]
    assert common["heldout"]["pass@8"]["last"] < swept["heldout"]["pass@8"]["last"]
    assert SUMMARY["meta"]["steps"] == common["steps"] == swept["steps"]


def test_the_readme_gives_the_kernel_spread_as_ranges_from_its_cells():
    text = demo_readme.paragraph(SUMMARY, spread=SPREAD)
    common = [c["runs"][kernel_spread.COMMON] for c in SPREAD["cells"]]
    warned = sorted(c["warning_step"] for c in common)
    under = sorted(c["under_20pct_step"] for c in common)
    span = lambda lo, hi: str(lo) if lo == hi else f"{lo}–{hi}"   # noqa: E731
    assert f"is warned of collapse at step {span(warned[0], warned[-1])}," in text
    assert f"falls under 20% of its start at step {span(under[0], under[-1])} " in text
    quiet = sum(c["runs"][kernel_spread.SWEPT]["warning_step"] is None for c in SPREAD["cells"])
    assert f"it goes unwarned in {quiet} of {len(SPREAD['cells'])} cells" in text
    assert "Every cell keeps the claims the tests assert: yes." in text


def test_the_reproducibility_page_table_is_rendered_from_the_committed_spread():
    page = (ROOT / "docs" / "explanation" / "reproducibility.md").read_text()
    import marked_block

    got = marked_block.block(page, kernel_spread.BEGIN, kernel_spread.END)
    assert got == kernel_spread.table(SPREAD), "stale: run `python bench/kernel_spread.py --render`"
    rows = [line for line in got.splitlines() if line.startswith("| ") and not line.startswith("| kernel")]
    assert len(rows) == len(SPREAD["cells"]) >= 9
