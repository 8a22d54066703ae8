"""`flashmap eval`: held-out teacher-forced accuracy per slot and the γ it implies (flashmap_ext.evaluate)."""
from __future__ import annotations

import argparse


def add_parser(subparsers) -> None:
    from flashmap_ext.evaluate import run
    p = subparsers.add_parser("eval", help="held-out per-slot accuracy and implied γ of drafters (JSON/MD/plot)",
                              description=run.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_arguments(p)
    p.set_defaults(func=run.run)
