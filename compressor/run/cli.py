"""The `compressor` command line: apply, validate, list.

Every error this project raises on purpose (a `CompressorError`) is printed as one line on
stderr and exits with code 2 (bad input: recipe, file, option, unsupported model) or 1 (work that
had started failed); `--debug` shows the traceback too.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings

from compressor.core.errors import CompressorError

EPILOG = """examples:
  compressor apply recipes/vit_hydra.yaml
  compressor apply recipes/vit_prune.yaml --out runs/try1 --set steps.0.prune.keep_ratio=0.25
  compressor validate recipes/vit_hydra.yaml
  compressor predict runs/vit_hydra/export my_images/ --out predictions.csv
  compressor list
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="compressor",
        description="Prune attention heads into diverse members and fuse them into one Hydra ensemble, "
        "or into a physically smaller model.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--debug", action="store_true", help="show the traceback of an error")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    a = sub.add_parser("apply", help="run a recipe end to end", description="Validate, then run every step of RECIPE.")
    a.add_argument("recipe", metavar="RECIPE", help="path to a YAML recipe")
    a.add_argument("--out", metavar="DIR", help="run folder (default: the recipe's `out`, else runs/<name>)")
    a.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a recipe value, e.g. model.train_base.steps=50 or steps.0.prune.members=4",
    )
    a.add_argument("--quiet", action="store_true", help="no progress bars or step messages")
    a.add_argument("--overwrite", action="store_true", help="replace the outputs of an earlier run in the run folder")
    v = sub.add_parser(
        "validate",
        help="check a recipe without running it",
        description="Check RECIPE: every key, step and plugin option, the cross-step rules, and (without "
        "training) that the model, one real batch and every step fit together.",
    )
    v.add_argument("recipe", metavar="RECIPE")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    pr = sub.add_parser(
        "predict",
        help="per-sample predictions with uncertainty and an OOD flag, from an export",
        description="Predict INPUTS (an image folder or a file listing images; for text models a .txt "
        "file, one sentence per line, .jsonl with a 'text' field, or a .csv/.jsonl/.parquet file with "
        "--column) with the model exported in EXPORT.",
    )
    pr.add_argument("export", metavar="EXPORT", help="an export folder (runs/<name>/export)")
    pr.add_argument("inputs", metavar="INPUTS")
    pr.add_argument(
        "--out", metavar="FILE", help="write FILE.csv or FILE.jsonl (default: CSV on stdout); never inside EXPORT"
    )
    pr.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    pr.add_argument("--batch-size", type=int, default=64)
    pr.add_argument("--top-k", type=int, default=3)
    pr.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    pr.add_argument(
        "--column", default=None, help="INPUTS is a .csv, .jsonl or .parquet file: its text (or image path) column"
    )
    sub.add_parser("list", help="registered steps, pruners, importances, mergers and model families")
    return p


def cmd_list() -> int:
    from compressor.core.registry import available

    plural = {"step": "steps", "pruner": "pruners", "importance": "importances", "merger": "mergers"}
    for kind in ("step", "pruner", "importance", "merger", "family"):
        print(f"{plural.get(kind, 'families')}:")
        for name, summary in available(kind).items():
            print(f"  {name:<16} {summary}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from compressor.run.recipe import load_recipe
    from compressor.run.runner import Runner

    recipe = load_recipe(args.recipe, args.overrides)
    Runner(recipe, quiet=True).check()
    print(f"{args.recipe}: ok ({len(recipe.steps)} steps: {', '.join(k for k, _ in recipe.steps)})")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from pathlib import Path

    from compressor.deploy.predict import check_output, predict_inputs, write_predictions

    check_output(Path(args.out) if args.out else None, Path(args.export), args.overwrite)
    rows = predict_inputs(
        args.export, args.inputs, args.batch_size, args.top_k, args.device, progress=True, column=args.column
    )
    text = write_predictions(rows, Path(args.out) if args.out else None)
    if args.out:
        flagged = sum(1 for r in rows if r["ood"])
        print(f"{len(rows)} predictions -> {args.out} ({flagged} flagged OOD)", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def cmd_apply(args: argparse.Namespace) -> int:
    from compressor.core.distributed import is_main, shutdown
    from compressor.run.recipe import load_recipe
    from compressor.run.runner import Runner

    recipe = load_recipe(args.recipe, args.overrides)
    t0 = time.time()
    runner = Runner(recipe, args.out, quiet=args.quiet, overwrite=args.overwrite)
    try:
        runner.run()
    finally:
        main_process = is_main()
        shutdown()
    if main_process:
        print(f"done in {time.time() - t0:.0f}s; outputs in {runner.out}/ (report.md, metrics.json, plots/, export/)")
    return 0


def _one_line_warning(message, category, filename, lineno, line=None) -> str:  # noqa: ANN001
    """Warnings as one line, like errors: 'warning: <message>' (no source line)."""
    return f"warning: {message}\n"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    warnings.formatwarning = _one_line_warning
    try:
        if args.command == "list":
            return cmd_list()
        if args.command == "validate":
            return cmd_validate(args)
        if args.command == "predict":
            return cmd_predict(args)
        return cmd_apply(args)
    except CompressorError as e:
        if args.debug:
            traceback.print_exc()
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(
            "interrupted: the run folder is marked RUNNING (incomplete); every file in it is whole "
            "(none is half-written); rerun with --overwrite",
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
