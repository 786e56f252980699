"""`forksight doctor SOURCE`: a post-hoc diagnosis of one run (every detector replayed over its
steps) and `forksight import SOURCE --db PATH`: the same readers bring a logged run into the
store, so every dashboard page and `alerts replay` work on it. Sources: a forksight DuckDB file,
and whatever forksight.monitor.importers reads (TRL, TensorBoard, W&B, verl, JSONL/CSV, TRL's
completions log, prime-rl's token export)."""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

# what each detector reads: a detector whose keys the run never logged was not checked
NEEDS = {
    "non_finite": ("any statistic",), "entropy_collapse": ("entropy/mean",), "covariance": ("cov/logp_adv",),
    "entropy_explosion": ("entropy/mean", "renyi2/mean"), "lost_diversity": ("pass@1", "groups/zero_var_frac"),
    "fork_starvation": ("fork/frac",), "stagnation": ("reward/mean",), "degenerate_groups": ("groups/zero_var_frac",),
    "truncation": ("length/clip_frac",), "clip_saturation": ("clip/frac",), "kl_drift": ("kl",),
    "gradient": ("grad_norm",), "reward_eval_divergence": ("eval/reward", "eval/pass@1"),
    "reward_composition": ("rewards/<name>/mean",),
    "train_inference_mismatch": ("mismatch/kl_k3", "mismatch/kl_k1", "mismatch/logp_diff_abs_mean",
                                 "mismatch/frac_outside_2x", "mismatch/seq_ess"),
    "length_hacking": ("length/mean", "completions/mean_length"),
    "clip_asymmetry": ("clip/high_frac and clip/low_frac", "clip_ratio/high_mean and clip_ratio/low_mean"),
    "kl_inert": ("kl", "actor/kl_loss"),
}
CLIP_SIDES = (("clip/high_frac", "clip/low_frac"), ("clip_ratio/high_mean", "clip_ratio/low_mean"))
SEVERITY_RANK = {"healthy": 0, "warning": 1, "critical": 2}


@dataclass
class Diagnosis:
    """One run's replayed alerts, the verdict, and what could and could not be checked."""

    name: str
    source: str
    kind: str
    steps: list[int]
    rows: list[dict]
    alerts: list[dict] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)
    not_checked: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)        # what the source held that could not be read as is

    @property
    def verdict(self) -> str:
        return max((a["severity"] for a in self.alerts), key=SEVERITY_RANK.get, default="healthy")

    def to_json(self) -> dict:
        return {"run": self.name, "source": self.source, "kind": self.kind, "steps": len(self.steps),
                "first_step": self.steps[0] if self.steps else None, "last_step": self.steps[-1] if self.steps else None,
                "verdict": self.verdict, "findings": self.alerts, "checked": self.checked,
                "not_checked": self.not_checked, "notes": self.notes}


def _is_duckdb(path: Path) -> bool:
    if path.suffix in (".duckdb", ".ddb"):
        return True
    try:
        with path.open("rb") as fh:
            return fh.read(12)[8:12] == b"DUCK"
    except OSError:
        return False


@dataclass
class Loaded:
    """One run as read: its steps of {forksight key: value}, and what an import stores besides."""

    name: str
    kind: str
    steps: list[int]
    rows: list[dict]
    config: dict
    samples: list = field(default_factory=list)       # samples-table rows (TRL's completions log)
    tokens: list = field(default_factory=list)        # tokens-table Arrow tables (prime-rl's export)
    histograms: list = field(default_factory=list)    # {step, key, counts, edges} (mismatch_log_ratio)
    notes: list = field(default_factory=list)         # what was read other than as written, for stderr


def load(source: str, run: str | None = None, fork_rule: str | None = None) -> Loaded:
    """One run; ValueError with what was expected otherwise. Samples (TRL's completions log) add pass@k
    to the steps; tokens (prime-rl's) add the mismatch scalars and histogram a live run would have."""
    from forksight.monitor.importers import read_source

    path = Path(source)
    if path.is_file() and _is_duckdb(path):
        return _load_db(path, run)
    imported = read_source(path, fork_rule)
    out = Loaded(imported.name, imported.kind, imported.steps, imported.rows, imported.config,
                 imported.samples, imported.tokens)
    if imported.samples:
        from forksight.compose.import_extras import merge_sample_scalars

        out.steps, out.rows = merge_sample_scalars(out.steps, out.rows, imported.samples)
    if imported.tokens:
        from forksight.compose.import_mismatch import import_mismatch

        out.steps, out.rows, out.tokens, out.histograms, out.notes = import_mismatch(
            out.steps, out.rows, imported.tokens, imported.corrected, imported.kind)
    if not out.steps:
        raise ValueError(f"{source} was read as {imported.kind} but holds no step with a number in it")
    return out


def _load_db(path: Path, run: str | None):
    from forksight.compose.alerts_cli import ALL_STEPS
    from forksight.monitor.collector.store import Store

    store = Store(str(path))
    try:
        runs = store.reader.list_runs()["run_id"].tolist()
        if run is None and len(runs) == 1:
            run = runs[0]
        if run is None or run not in runs:
            raise ValueError(f"{'no run ' + repr(run) if run else 'pass --run'} in {path}; runs there: "
                             f"{', '.join(runs[:20]) or '(none)'}")
        frame = store.reader.read_scalars(run, downsample=ALL_STEPS).dropna(subset=["value"])
        config = (store.reader.run(run) or {}).get("config") or {}
    finally:
        store.close()
    steps, rows = [], []
    for step, group in frame.sort_values(["step", "key"]).groupby("step", sort=True):
        steps.append(int(step))
        rows.append(dict(zip(group["key"], group["value"].astype(float))))
    return Loaded(run, "forksight", steps, rows, config if isinstance(config, dict) else {})


def diagnose(source: str, run: str | None = None, config=None) -> Diagnosis:
    """Replay every detector over the run's steps (in step order) and say what was checked."""
    from forksight.monitor.alerts.hub import AlertMonitor, alert_row, evidence_of

    loaded = load(source, run)
    name, kind, steps, rows, run_config = loaded.name, loaded.kind, loaded.steps, loaded.rows, loaded.config
    vocab = run_config.get("vocab_size") if isinstance(run_config.get("vocab_size"), int) else None
    monitor = AlertMonitor(config, vocab)
    alerts = []
    for step, row in zip(steps, rows):
        for alert in monitor.observe(step, row):
            r = alert_row(name, alert, math.nan)
            r.pop("wall_time")
            alerts.append({**r, "evidence": evidence_of(r)})
    keys = {k for row in rows for k in row}
    present = {
        d: (d == "non_finite" and bool(keys)) or any(k in keys for k in need) or (
            d == "lost_diversity" and any(k.startswith("pass@") for k in keys)) or (
            d == "reward_composition" and sum(k.startswith("rewards/") and k.endswith("/mean") for k in keys) >= 2) or (
            d == "reward_eval_divergence" and any(k.startswith("eval/") for k in keys)) or (
            d == "clip_asymmetry" and any({a, b} <= keys for a, b in CLIP_SIDES))
        for d, need in NEEDS.items()}
    return Diagnosis(name, str(source), kind, steps, rows, alerts,
                     checked=[d for d, ok in present.items() if ok],
                     not_checked={d: f"needs {' or '.join(NEEDS[d])}" for d, ok in present.items() if not ok},
                     notes=loaded.notes)


# ---------------------------------------------------------------------------- commands
def add_parser(subparsers) -> None:
    """Register `doctor` and `import` (light: heavy imports happen when they run)."""
    doctor = subparsers.add_parser("doctor", help="diagnose one logged run: every detector replayed, a verdict",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    doctor.add_argument("source", help="forksight DuckDB file, TRL trainer_state.json or checkpoint dir, "
                                       "TensorBoard log dir, W&B offline run dir, verl file-logger JSONL, a JSONL/CSV "
                                       "of step dicts, TRL's completions/ log or prime-rl's token_exports/")
    doctor.add_argument("--run", help="run id, for a forksight DuckDB file holding several")
    doctor.add_argument("--format", choices=("terminal", "markdown", "html", "json"), default="terminal")
    doctor.add_argument("--output", "-o", help="write the report here instead of standard output")
    doctor.add_argument("--html", metavar="FILE", help="also write the run as one self-contained HTML file, "
                        "charts and tokens included, as `forksight report` does")
    doctor.add_argument("--fail-on", choices=("warning", "critical"),
                        help="exit 1 when the verdict is this severity or worse (a CI gate)")
    doctor.add_argument("--config", help="alert config file (YAML or JSON), as for `alerts replay`")
    doctor.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    doctor.set_defaults(func=run_doctor)
    imp = subparsers.add_parser("import", help="bring a logged run (TRL, TensorBoard, W&B, verl, JSONL/CSV, TRL "
                                               "completions, prime-rl token export) into a "
                                               "forksight DuckDB file")
    imp.add_argument("source", help="as for `forksight doctor`")
    imp.add_argument("--db", required=True, help="DuckDB file to add the run to (created if missing; not one a "
                                                 "running collector holds)")
    imp.add_argument("--run", help="name of the new run (default: the source's name)")
    imp.add_argument("--project", default="imported", help="project to file the run under")
    imp.add_argument("--fork-rule", default=None, help="which tokens are forks where the log holds per-token "
                     "entropies (prime-rl's token export): abs:τ or top:q (default abs:0.672)")
    imp.add_argument("--tokenizer", help="tokenizer (directory or hub name) to show token text for a token "
                                         "export that holds ids only (prime-rl)")
    imp.set_defaults(func=run_import)


def _fail(command: str, message: str) -> int:
    print(f"forksight {command}: {message}", file=sys.stderr)
    return 2


def run_doctor(args: argparse.Namespace) -> int:
    from forksight.compose.doctor_report import render
    from forksight.monitor.alerts.hub import load_alert_config

    try:
        config = load_alert_config(args.config, args.overrides)
        result = diagnose(args.source, args.run, config)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        return _fail("doctor", str(exc))
    for note in result.notes:
        print(f"forksight doctor: warning: {note}", file=sys.stderr)
    if args.html:
        try:
            problem = write_html(args.source, args.run, args.html)
        except (ValueError, FileNotFoundError, RuntimeError) as exc:
            problem = str(exc)
        if problem:
            return _fail("doctor", problem)
    text = render(result, args.format)
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
        print(f"{result.verdict}: report written to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    if args.fail_on and SEVERITY_RANK[result.verdict] >= SEVERITY_RANK[args.fail_on]:
        return 1
    return 0


def write_html(source: str, run: str | None, out: str) -> str | None:
    """The run as `forksight report` writes it (a forksight DuckDB file read as it is; any other
    log imported into a temporary store first); a problem as one line, else None."""
    import tempfile

    from forksight.compose.report_cli import output_problem, write_atomically
    from forksight.dashboard.report_html import render_report
    from forksight.monitor.collector.store import Store

    if (problem := output_problem(Path(out))) is not None:
        return problem
    with tempfile.TemporaryDirectory(prefix="forksight-doctor-") as tmp:
        if _is_duckdb(Path(source)):
            db, run_id = source, run or _load_db(Path(source), run).name
        else:
            loaded = load(source, run)
            db = str(Path(tmp) / "run.duckdb")
            run_id = import_into(db, loaded, loaded.name, "doctor", source)["run_id"]
        with Store(db, verify=False) as store:
            text = render_report(store.reader, run_id)
    return write_atomically(text, Path(out))


def run_import(args: argparse.Namespace) -> int:
    try:
        loaded = load(args.source, fork_rule=args.fork_rule)
        name, tokens = loaded.name, loaded.tokens
        if tokens and args.tokenizer:
            from forksight.compose.import_extras import decode_tokens

            tokens = decode_tokens(tokens, args.tokenizer)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        return _fail("import", str(exc))
    for note in loaded.notes:
        print(f"forksight import: warning: {note}", file=sys.stderr)
    try:
        summary = import_into(args.db, loaded, args.run or name, args.project, args.source, tokens=tokens)
    except RuntimeError as exc:
        return _fail("import", str(exc))
    print(json.dumps(summary))
    return 0


def import_into(db: str, loaded: Loaded, run: str, project: str, source: str, tokens=None) -> dict:
    """Write a loaded run (its scalars, samples, tokens, histograms) into the store at `db` and
    replay the detectors over it; returns the summary `forksight import` prints (RuntimeError: the
    file is held by another process)."""
    from forksight.base.limits import MAX_KEY_CHARS, NONFINITE_PREFIX
    from forksight.base.records import Records, histograms_table, scalars_table
    from forksight.compose.alerts_cli import replay_rows, write_rows
    from forksight.compose.import_extras import write_extras
    from forksight.monitor.collector.store import Store

    kind, steps, rows = loaded.kind, loaded.steps, loaded.rows
    store = Store(db)
    codes = {"nan": 0.0, "inf": 1.0, "-inf": -1.0}
    skipped = 0
    try:
        run_id = store.create_run(run, project=project,
                                  config={**loaded.config, "imported_from": str(source), "format": kind})
        batch: list[dict] = []
        for step, row in zip(steps, rows):
            for key, value in row.items():
                if len(key) > MAX_KEY_CHARS - len(NONFINITE_PREFIX) or not key:
                    skipped += 1
                elif math.isfinite(value):
                    batch.append({"step": step, "key": key, "value": value})
                else:   # as a sink stores it: the marker the non-finite detector reads back
                    batch.append({"step": step, "key": NONFINITE_PREFIX + key, "value": codes[str(value)]})
            if len(batch) >= 50_000:
                store.write(run_id, Records(scalars=scalars_table(batch)))
                batch = []
        if batch:
            store.write(run_id, Records(scalars=scalars_table(batch)))
        extras = write_extras(store, run_id, loaded.samples, loaded.tokens if tokens is None else tokens)
        for start in range(0, len(loaded.histograms), 1_000):
            store.write(run_id, Records(histograms=histograms_table(loaded.histograms[start:start + 1_000])))
        store.flush()
        alerts, _ = replay_rows(store.reader, run_id, None)
        write_rows(store, run_id, alerts)
        store.update_run(run_id, status="finished")
    finally:
        store.close()
    return {"run_id": run_id, "format": kind, "steps": len(steps), "alerts": len(alerts),
            "keys": len({k for r in rows for k in r}), "skipped_values": skipped, **extras,
            "histograms": len(loaded.histograms)}
