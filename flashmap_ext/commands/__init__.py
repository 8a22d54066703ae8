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
