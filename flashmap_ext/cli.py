"""`flashmap` command line: one subcommand per module in flashmap_ext/commands/.

Each command module exposes `add_parser(subparsers)` (which sets `func` via set_defaults) so this file
never grows with the commands.
"""
import argparse
import importlib
import os
import sys
import time

from flashmap_ext.assets.models import AssetError  # missing/unknown offline assets are user errors too

COMMANDS = ["generate", "train", "distill", "data", "features", "bench", "demo", "eval", "convert", "testbed"]


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (`flashmap generate: error: ... (see flashmap generate --help)`,
    exit code 2) instead of the usage block; the subcommands' parsers are of this class too. Options are
    never abbreviated: `demo --n 4` would otherwise silently mean `--no-auto`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="flashmap", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"flashmap_ext.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"flashmap_ext.commands.{name}":
                raise
            continue
        module.add_parser(sub)
    parser.commands = sub.choices  # name -> its parser, for errors that name the subcommand
    return parser


def parse(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """parse_args, with arguments no option took reported by the subcommand's parser (`flashmap eval:
    error: unrecognized arguments: ...`), not by `flashmap`'s."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


#: what an interrupted command left, for its Ctrl-C line (commands that write nothing have none)
RESUME_HINT = {"train": "; rerun with --resume to continue from the newest checkpoint",
               "distill": "; rerun with --resume to continue from the newest checkpoint",
               "features": "; files already written are kept: rerun the same command to add the rest",
               "data": "; files already written are kept: rerun the same command to add the rest",
               "bench": "; the prompts that finished are in --out (results.json, marked partial)"}


def interrupt_hint(args, started: float) -> str:
    """The Ctrl-C line's tail: what the interrupted command kept (an action such as `bench compare` sets
    `resume_hint` "": it keeps nothing). bench keeps finished prompts only when one finished in this run
    (its results.json written since `started`, a time.time())."""
    if hasattr(args, "resume_hint"):
        return args.resume_hint
    if args.command == "bench":
        results = os.path.join(getattr(args, "out", "") or "", "results.json")
        # file times come from the kernel's coarse clock, which can trail time.time() by a tick: 1 s of slack
        if not (os.path.isfile(results) and os.path.getmtime(results) >= started - 1.0):
            return "; no prompt had finished, so nothing was written"
    if args.command in ("train", "distill"):
        from flashmap_ext.train.checkpoint import latest  # what --resume continues from
        if latest(getattr(args, "out", None) or "") is None:
            return "; no checkpoint was saved yet: rerun the same command to start again"
    return RESUME_HINT.get(args.command, "")


def command_name(args) -> str:
    """`train flow`, `bench compare`, `generate`: the words that name what ran, as its parser's errors do."""
    words = [args.command, getattr(args, "stage", None), getattr(args, "action", None)]
    return " ".join(w for w in words if w)


def main(argv=None) -> int:
    """Runs one command. User errors (bad arguments, missing files) print one line and exit 2; Ctrl-C prints
    one line and exits 130; FLASHMAP_DEBUG=1 shows the full traceback instead."""
    try:
        args = parse(build_parser(), argv)  # imports every command module (torch): seconds a Ctrl-C may hit
    except KeyboardInterrupt:
        if os.environ.get("FLASHMAP_DEBUG") == "1":
            raise
        print("flashmap: interrupted while starting; nothing was run", file=sys.stderr)
        return 130
    started = time.time()
    try:
        from flashmap_ext.target.load import check_not_a_drafter
        check_not_a_drafter(getattr(args, "target", None))
        return int(args.func(args) or 0)
    except (ValueError, TypeError, FileNotFoundError, FileExistsError, NotADirectoryError, NotImplementedError,
            FloatingPointError, AssetError) as err:
        if os.environ.get("FLASHMAP_DEBUG") == "1":
            raise
        message = " ".join(str(err).split())  # one line, whatever the library's message looked like
        print(f"flashmap {command_name(args)}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if os.environ.get("FLASHMAP_DEBUG") == "1":
            raise
        print(flush=True)  # ends a line the command was streaming (generate, demo) before the stderr line
        print(f"flashmap {command_name(args)}: interrupted{interrupt_hint(args, started)}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
