"""The `compressor` command line: apply, validate, list."""

from __future__ import annotations

import argparse
import sys
import time

from compressor.recipe import RecipeError, load_recipe

EPILOG = """examples:
  compressor apply recipes/vit_hydra.yaml
  compressor apply recipes/vit_prune.yaml --out runs/try1 --set steps.0.prune.keep_ratio=0.25
  compressor validate recipes/vit_hydra.yaml
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
    v = sub.add_parser("validate", help="check a recipe without running it")
    v.add_argument("recipe", metavar="RECIPE")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY.PATH=VALUE")
    sub.add_parser("list", help="registered pruners and mergers, one line each")
    return p


def cmd_list() -> int:
    from compressor.registry import available

    for kind in ("pruner", "merger"):
        print(f"{kind}s:")
        for name, summary in available(kind).items():
            print(f"  {name:<16} {summary}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "list":
        return cmd_list()
    try:
        recipe = load_recipe(args.recipe, args.overrides)
    except RecipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.command == "validate":
        print(f"{args.recipe}: ok ({len(recipe.steps)} steps: {', '.join(k for k, _ in recipe.steps)})")
        return 0
    from compressor.distributed import is_main, shutdown
    from compressor.runner import Runner

    t0 = time.time()
    runner = Runner(recipe, args.out, quiet=args.quiet)
    try:
        runner.run()
    except KeyboardInterrupt:
        print("interrupted; finished outputs are intact, nothing half-written was left", file=sys.stderr)
        return 130
    except (ValueError, RuntimeError, NotImplementedError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        main_process = is_main()
        shutdown()
    if not main_process:
        return 0
    print(f"done in {time.time() - t0:.0f}s; outputs in {runner.out}/ (report.md, metrics.json, plots/, export/)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
