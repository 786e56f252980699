"""docs/algorithms.md is in the repository, cited by the README and `train --help`, and names only
code that exists: every `path.py` it points at and every function it says lives there."""
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
