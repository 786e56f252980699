"""The documentation site (mkdocs.yml, docs/): it builds with strict link and anchor checks into
static HTML; its reference pages are what docs/gen_reference.py makes from the code now (a stale page
fails), they cover every command, option, detector key, HTTP path and table column; and every file,
`forksight` command, option and HTTP path that README.md or a docs page names exists."""
from __future__ import annotations

import difflib
import html
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, DOCS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gen = _load("gen_reference")


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return gen.pages()


@pytest.fixture(scope="module")
def parser():
    from forksight.compose.cli import build_parser

    return build_parser()


@pytest.fixture(scope="module")
def spec() -> dict:
    return gen.openapi()


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


# ---------------------------------------------------------------------------- generated, never typed
def test_every_generated_page_is_what_the_code_makes_now(generated):
    stale = [name for name, text in generated.items()
             if not (DOCS / name).exists() or (DOCS / name).read_text() != text]
    assert not stale, f"stale generated pages {stale}: run `make docs-ref` (python docs/gen_reference.py)"


def test_the_check_flag_names_a_stale_page_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gen, "DOCS", tmp_path)       # an empty docs folder: every page is missing
    assert gen.main(["--check"]) == 1
    assert "reference/cli.md" in capsys.readouterr().err and not any(tmp_path.iterdir())
    assert gen.main([]) == 0 and (tmp_path / "reference" / "cli.md").read_text() == gen.pages()["reference/cli.md"]
    assert gen.main(["--check"]) == 0


def test_the_cli_page_holds_every_command_and_option(generated, parser):
    page = html.unescape(generated["reference/cli.md"]).replace("\\", "")
    commands = gen.command_options(parser)
    assert {"serve", "train", "demo", "doctor", "import", "export", "compact", "alerts replay", "lake compact"} <= set(commands)
    for command, options in commands.items():
        section = page.split(f"\n## forksight {command}\n", 1)[1].split("\n## ", 1)[0]
        for option in options - {"-h", "--help"}:
            assert f"<code>{option}</code>" in section, (command, option)


def test_the_alert_page_holds_every_detector_key_with_its_default(generated):
    import json

    from forksight.monitor.alerts.config import AlertConfig
    from forksight.monitor.alerts.hub import AlertMonitor

    page = html.unescape(generated["reference/alerts-config.md"]).replace("\\", "")
    monitor = AlertMonitor()
    names = {d.name for d in (monitor._non_finite, *monitor._detectors)}
    assert len(names) >= 15 and all(f"<code>{n}</code>" in page for n in names)
    common = page.split("\n## Keys every section has\n", 1)[1].split("\n## ", 1)[0]
    for section, field in AlertConfig.model_fields.items():
        body = page.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
        for key, f in field.annotation.model_fields.items():
            row = next((line for text in (body, common) for line in text.splitlines()
                        if line.startswith(f"| <code>{key}</code> |")), None)
            assert row is not None, (section, key)
            default = f.default if f.default_factory is None else f.default_factory()
            assert f"<code>{json.dumps(default, ensure_ascii=False)}</code>" in row, (section, key, row)


def test_the_api_page_holds_every_path_and_method_of_the_openapi(generated, spec):
    page = html.unescape(generated["reference/http-api.md"]).replace("\\", "")
    operations = [(m.upper(), p) for p, item in spec["paths"].items() for m in item]
    assert ("GET", "/api/health") in operations and len(operations) >= 15
    for method, path in operations:
        assert f"\n## {method} {path}\n" in page, (method, path)


def test_the_tables_page_holds_every_table_and_column(generated):
    from forksight.base.tables import TABLES

    page = html.unescape(generated["reference/tables.md"]).replace("\\", "")
    for table in TABLES.values():
        body = page.split(f"\n## {table.name}\n", 1)[1].split("\n## ", 1)[0]
        for column in table.columns:
            assert f"| <code>{column.name}</code> | <code>{column.sql}</code> |" in body, (table.name, column.name)


# ---------------------------------------------------------------------------- the built site
def test_the_site_builds_strict_into_static_pages(tmp_path):
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the reference is in the HTML itself (tables, headings), readable without JavaScript
    cli = (site / "reference" / "cli.html").read_text()
    assert '<table>' in cli and 'id="forksight-serve"' in cli and "<code>--lake-catalog</code>" in cli
    alerts = (site / "reference" / "alerts-config.html").read_text()
    assert 'id="collapse"' in alerts and "<code>forecast_horizon</code>" in alerts
    for page in ("index.html", "tutorial/demo.html", "reference/http-api.html", "reference/tables.html",
                 "explanation/performance.html", "algorithms.html", "howto/trl.html"):
        assert (site / page).is_file(), page
    assert (site / "screenshots" / "runs.png").is_file()


# ---------------------------------------------------------------------------- what the docs name exists
def _code(text: str) -> list[str]:
    """The code the page shows: fenced blocks line by line, and inline `spans`."""
    fences = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M)
    prose = re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)
    spans = re.findall(r"`([^`\n]+)`", prose) + re.findall(r"<code>(.*?)</code>", prose)
    lines = [line for block in fences for line in block.splitlines()]
    lines += [re.sub(r"\\([\\*_\[\]])", r"\1", html.unescape(s)) for s in spans]   # generated cells escape _*[]
    # a shell comment is prose; `> FILE` is a file the command writes, not one that must exist
    return [re.sub(r"(^|\s)#\s.*$|>\s*\S+", " ", line) for line in lines]


def forksight_calls(snippet: str) -> list[list[str]]:
    """Each `forksight CMD ...` in a snippet as its words (up to a comment, pipe or the next command)."""
    calls = []
    for match in re.finditer(r"(?:^|[\s/])forksight\s+([a-z][^\n#|;&`]*)", snippet):
        calls.append(match.group(1).replace("\\", " ").split())
    return calls


def test_the_command_finder_reads_a_call_as_the_docs_write_it():
    assert forksight_calls("forksight serve --db x.duckdb --port 8050   # note") == [["serve", "--db", "x.duckdb", "--port", "8050"]]
    assert forksight_calls(".venv/bin/forksight lake compact --lake-catalog URI") == [["lake", "compact", "--lake-catalog", "URI"]]
    assert forksight_calls("forksight.trl.attach(trainer)") == [] and forksight_calls("pip install 'forksight[lake]'") == []


def test_every_forksight_command_and_option_the_docs_name_exists(parser):
    commands = gen.command_options(parser)
    named, wrong = 0, []
    for page in _pages():
        for snippet in _code(page.read_text()):
            for words in forksight_calls(snippet):
                if words[0] not in commands:
                    # a misspelt command, or any word given options; else prose (a message the code prints)
                    if not (difflib.get_close_matches(words[0], commands, cutoff=0.75)
                            or any(w.startswith("--") for w in words)):
                        continue
                    wrong.append(f"{page.relative_to(REPO)}: `forksight {' '.join(words)}` names no command")
                    continue
                command = " ".join(words[:2]) if " ".join(words[:2]) in commands else words[0]
                for word in words:
                    option = word.split("=", 1)[0]
                    if option.startswith("--") and len(option) > 2 and option not in commands[command]:
                        wrong.append(f"{page.relative_to(REPO)}: forksight {command} has no {option}")
                named += 1
    assert not wrong, "\n".join(wrong)
    assert named >= 30


def _templates(spec: dict) -> list[re.Pattern]:
    return [re.compile("^" + re.sub(r"\\\{[^}]*\\\}", r"[^/]+", re.escape(p)) + "$") for p in spec["paths"]]


def test_every_http_path_the_docs_name_is_in_the_openapi(spec):
    templates = _templates(spec)
    named, wrong = 0, []
    for page in _pages():
        for snippet in _code(page.read_text()):
            for path in re.findall(r"(/api/[\w/{}.-]*\w\}?)", snippet):
                if not any(t.match(path) for t in templates):
                    wrong.append(f"{page.relative_to(REPO)}: {path} is not an HTTP path")
                named += 1
    assert not wrong, "\n".join(wrong)
    assert named >= 10


def test_every_file_the_docs_link_or_name_exists():
    roots = ("bench", "docs", "tests", "examples", "hooks", "monitor", "core", "trainer", "dashboard")
    checked, wrong = 0, []
    for page in _pages():
        text = page.read_text()
        links = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'(?:src|href)="([^"]+)"', text)
        for link in links:
            if re.match(r"[a-z]+:|#", link):
                continue
            if not (page.parent / link.split("#", 1)[0]).resolve().exists():
                wrong.append(f"{page.relative_to(REPO)} links to {link}, which does not exist")
            checked += 1
        for snippet in _code(text):
            for path in re.findall(rf"(?<![\w/.])((?:{'|'.join(roots)})/[\w./-]*\w)", snippet):
                if re.search(r"[<*{]|(?:^|/)[A-Z_]{2,}(?:[./]|$)", path):     # a pattern or a PLACEHOLDER
                    continue
                if not (REPO / path).exists():
                    wrong.append(f"{page.relative_to(REPO)} names {path}, which does not exist")
                checked += 1
    assert not wrong, "\n".join(wrong)
    assert checked >= 50
