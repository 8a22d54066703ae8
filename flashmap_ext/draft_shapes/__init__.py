"""Draft shapes that are not drafters, and what they cost (DESIGN.md §7, "Draft shapes per round").

lookup.py (prompt lookup, alone or around a block drafter), block_tree.py (token trees from block drafters:
top-k per slot, several noise draws), auto.py (`AutoDrafter`: per round, the shape the cost model expects to be
fastest); their cost machinery: cost_model.py (cost table, acceptance profile, the choice), tree_plan.py
(expected tokens of block-drafter trees), calibrate.py (this machine's cost table, measured once and cached).
"""
