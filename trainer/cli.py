"""`forksight train`: flags are generated from TrainConfig (each with its description), grouped
as the config is; precedence preset < --config file < flags. Light at import: torch loads only
when the command runs.
"""
from __future__ import annotations

import argparse
import json
import sys
import typing
from typing import Any


# shorter spellings of a few flags (the long one, generated from the field name, also works)
FLAG_ALIASES: dict[str, tuple[str, ...]] = {"tis_cap": ("--tis",)}


def _flag_kwargs(annotation: Any) -> dict[str, Any]:
    """argparse type/choices for a field annotation (Optional[X] → X, Literal → choices)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Union or type(annotation).__name__ == "UnionType":
        return _flag_kwargs(args[0]) if len(args) == 1 else {"type": str}
    if typing.get_origin(annotation) is typing.Literal:
        return {"choices": list(args), "type": type(args[0])}
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation in (int, float, str):
        return {"type": annotation}
    return {"type": str}


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `forksight train`."""
    from forksight.trainer.config import PRESETS, TrainConfig, field_groups

    parser = subparsers.add_parser(
        "train", help="Train the bundled selective-RLVR trainer, streaming to forksight.",
        description="GRPO/DAPO with token selection on a local HF causal LM (default: the tiny "
                    "offline model). With neither --db nor --url the records go to a collector "
                    "on 127.0.0.1:8050, started in-process if none answers.",
        epilog="Formulas and sources of the strategies, statistics and alerts: docs/algorithms.md "
               "in the forksight repository.",
    )
    parser.add_argument("--config", metavar="FILE", help="YAML or JSON file of config fields.")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="Named starting point.")
    parser.add_argument("--print-config", action="store_true",
                        help="Print the resolved config as JSON and exit.")
    for group, names in field_groups().items():
        arg_group = parser.add_argument_group(group)
        for name in names:
            info = TrainConfig.model_fields[name]
            help_text = f"{info.description} (default: {info.default})"
            flags = [f"--{name.replace('_', '-')}", *FLAG_ALIASES.get(name, ())]
            arg_group.add_argument(*flags, dest=name, default=None,
                                   help=help_text.replace("%", "%%"),
                                   **_flag_kwargs(info.annotation))
    parser.set_defaults(func=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Resolve the config, train, print the result as JSON."""
    from forksight.trainer.config import TrainConfig, load_config

    overrides = {name: getattr(args, name, None) for name in TrainConfig.model_fields}
    try:
        config = load_config(args.config, args.preset, overrides)
    except (ValueError, FileNotFoundError) as exc:
        print(f"forksight train: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(config.model_dump_json(indent=1))
        return 0
    from forksight.trainer.loop import train
    from forksight.trainer.sampler import SamplerUnsupported

    try:
        result = train(config)
    except SamplerUnsupported as exc:
        print(f"forksight train: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        # the DuckDB file could not be opened (held by a collector, unreadable, damaged): the
        # store's message says why and what to do; anything else is a bug and keeps its traceback
        if not (config.db and str(exc).startswith(f"cannot open {config.db}")):
            raise
        print(f"forksight train: {exc}", file=sys.stderr)
        return 1
    if result.steps is not None:
        line = json.dumps({"run_id": result.run_id, "steps": result.steps,
                           "stopped_early": result.stopped_early, "seconds": result.seconds,
                           "final": {k: round(v, 5) for k, v in result.final.items()},
                           "eval": result.eval, "checkpoint": result.checkpoint})
        # One write of the whole line: under torchrun every rank shares this pipe, and with
        # PYTHONUNBUFFERED print() would write the text and its newline separately, letting
        # another rank's line land between them.
        sys.stdout.flush()
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
    return 0
