"""docs/algorithms.md is in the repository, cited by the README and `train --help`, and names only
code that exists: every `path.py` it points at and every function it says lives there. The README is
a newcomer's page: at most 200 lines, the two commands first, the demo's block, links into the docs
site, and no figure typed into its prose (tests/test_docs_site.py checks the site itself)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "algorithms.md"


def test_readme_and_train_help_cite_the_reference_inside_the_repository():
    readme = (REPO / "README.md").read_text()
    help_text = subprocess.run([sys.executable, "-m", "forksight", "train", "--help"], capture_output=True,
                               text=True, check=True).stdout
    for text in (readme, help_text):
        assert "docs/algorithms.md" in text
        assert "ALGORITHMS.md" not in text        # the design notes outside the repository


def test_every_code_path_and_function_the_reference_names_exists():
    doc = DOC.read_text()
    paths = set(re.findall(r"`((?:hooks|trainer|monitor|core|dashboard)/[\w/]+\.py)", doc))
    assert len(paths) >= 8
    for path in paths:
        assert (REPO / path).is_file(), path
    # "`file.py: name`" and "(`name`)" right after a section's file: the names are defined there
    for path, name in re.findall(r"`((?:hooks|trainer|monitor)/[\w/]+\.py): (\w+)`", doc):
        assert re.search(rf"def {name}\b", (REPO / path).read_text()), (path, name)
    code = "\n".join(p.read_text() for p in REPO.glob("hooks/metrics/*.py"))
    for name in ("token_stats", "token_kl", "summarize", "group_scalars", "top_rho_per_response",
                 "token_covariance", "pass_at_k"):
        assert f"`{name}`" in doc and re.search(rf"def {name}\b", code), name


def test_the_reference_numbers_are_the_codes():
    from forksight.base.constants import FORK_ENTROPY
    from forksight.monitor.alerts.config import CollapseConfig
    from forksight.trainer.config import TrainConfig

    doc = DOC.read_text()
    assert f"H ≥ {FORK_ENTROPY}" in doc
    c = CollapseConfig()
    assert f"max({c.floor}, {1 - c.drop_fraction:g}·H₀)" in doc
    assert f"({100 * c.warn_drop_fraction:.0f}% down)" in doc
    fields = TrainConfig.model_fields
    assert f"ε_low = {fields['clip_low'].default}, ε_high = {fields['clip_high'].default}" in doc
    assert f"τ_p = {fields['stapo_tau_p'].default}" in doc


def test_no_source_file_cites_the_design_notes_outside_the_repository():
    folders = ("core", "monitor", "hooks", "trainer", "dashboard", "bench")
    citing = [str(p.relative_to(REPO)) for f in folders for p in (REPO / f).rglob("*.py")
              if "ALGORITHMS.md" in p.read_text()]
    assert not citing, citing


# ---------------------------------------------------------------------------- the README, a newcomer's page
README = REPO / "README.md"
DEMO_BEGIN, DEMO_END = "<!-- demo:begin -->", "<!-- demo:end -->"


def test_readme_is_read_in_five_minutes_with_the_two_commands_near_the_top():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move detail into docs/"
    first_block = lines[lines.index("```bash") + 1:]
    first_block = first_block[:first_block.index("```")]
    assert lines.index("```bash") < 40
    assert [line.split("#")[0].strip() for line in first_block] == ["make demo", "make test"]


def test_readme_keeps_one_demo_block_for_the_demos_own_summary():
    text = README.read_text()
    assert text.count(DEMO_BEGIN) == 1 and text.count(DEMO_END) == 1
    assert text.index(DEMO_BEGIN) < text.index(DEMO_END)


def test_readme_links_every_part_of_the_docs_site():
    text = README.read_text()
    for page in ("docs/tutorial/demo.md", "docs/howto/trl.md", "docs/howto/verl.md", "docs/howto/any-loop.md",
                 "docs/reference/cli.md", "docs/reference/alerts-config.md", "docs/reference/http-api.md",
                 "docs/reference/tables.md", "docs/explanation/performance.md", "docs/explanation/limitations.md"):
        assert f"]({page})" in text, page
    assert "the demo's collapse is provoked" not in text.lower() and "pass@1 stays 0" not in text


def test_readme_prose_types_no_figure_only_versions_and_the_codes_constants():
    # figures live in generated pages (docs/explanation/*.md from JSON) and in the demo's own block; what is
    # left in the README's prose may only be a version it names or a constant the code defines
    import json
    import tomllib

    from forksight.base.constants import FORK_ENTROPY

    text = README.read_text()
    text = text[:text.index(DEMO_BEGIN)] + text[text.index(DEMO_END):]
    prose = re.sub(r"`[^`]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))
    prose = re.sub(r"https?://\S+|\d+\.\d+\.\d+\.\d+(:\d+)?", "", prose)
    peers = json.loads((REPO / "docs" / "bench" / "alerts.json").read_text())["peers"]
    python = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"].lstrip(">=")
    allowed = {str(FORK_ENTROPY), python, *peers.values()}
    for name, version in peers.items():
        assert f"{name} {version}" in prose, name          # the versions the peer table was read from
    decimals = set(re.findall(r"(?<![\w.])\d+\.\d+(?:\.\d+)?(?![\w.])", prose))
    assert decimals <= allowed, decimals - allowed
