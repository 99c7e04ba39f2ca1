"""Helpers shared by more than one test tier: NumPy only, so tests/core can use them."""
