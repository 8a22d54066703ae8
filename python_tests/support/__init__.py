"""Helpers shared by the tests: drafter doubles, loop and verify helpers, numerics, training fixtures."""
