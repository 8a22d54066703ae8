"""The `flashmap` subcommands, one module each (cli.py builds the parser from them)."""
import argparse


def io_parser(subparsers, name: str, help: str, description: str, example: str, data_help: str,
              out_help: str) -> argparse.ArgumentParser:
    """A data-preparation subcommand's parser with its --target, --data and --out."""
    p = subparsers.add_parser(name, help=help, description=description, epilog=f"example: {example}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="hub name, local dir, .gguf file, or 'tiny-random'")
    p.add_argument("--data", required=True, help=data_help)
    p.add_argument("--out", required=True, help=out_help)
    return p


def add_actions(parser: argparse.ArgumentParser, title: str, modules: dict) -> None:
    """Optional ACTION subcommands of a command (`flashmap bench compare ...`): {name: (help, module)}, each
    module with a docstring (its description), add_arguments(p) and run(args). Without an ACTION the command
    runs as before. An action writes no partial output, so an interrupted one has no resume hint."""
    actions = parser.add_subparsers(dest="action", metavar="ACTION", title=title)
    for name, (help, module) in modules.items():
        p = actions.add_parser(name, help=help, description=module.__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(func=module.run, resume_hint="")
