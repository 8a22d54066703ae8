"""`flashmap generate` runs on the built-in tiny random target, for tests of the CLI and of draft shapes."""
from flashmap_ext import cli

BASE = ["generate", "--target", "tiny-random", "--prompt", "Hello, world", "--max-new-tokens", "24",
        "--dtype", "fp32"]


def run_cli(argv, capsys):
    """Runs `flashmap ARGV` (asserting exit 0) and returns its (stdout, stderr)."""
    assert cli.main(argv) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err
