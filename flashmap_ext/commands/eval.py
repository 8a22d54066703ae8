"""`flashmap eval`: held-out teacher-forced accuracy per slot and the γ it implies (flashmap_ext.evaluate),
and the analyses built on its output (compare, curve, verdict, ablation)."""
from __future__ import annotations

import argparse

from flashmap_ext.commands import add_actions


def add_parser(subparsers) -> None:
    from flashmap_ext.evaluate import ablation, compare, curve, run, verdict
    p = subparsers.add_parser("eval", help="held-out per-slot accuracy and implied γ of drafters (JSON/MD/plot)",
                              description=run.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_arguments(p)
    p.set_defaults(func=run.run)
    add_actions(p, "analyses (without ACTION: evaluate the drafters)", {
        "compare": ("held-out γ of several drafters with paired bootstrap intervals of their differences", compare),
        "curve": ("learning curve (table, stopping rule, plot) of a long run's evals", curve),
        "verdict": ("does a long-run piece beat the committed checkpoint on held-out?", verdict),
        "ablation": ("Markdown table of an ablation run's arms", ablation)})
