"""attnlab's tests, in tiers: core (NumPy only), torch, models, report, conformance, browser.

A package so that tests/ itself never lands on ``sys.path``: there, the tier folder
``tests/torch`` would pass for the torch package wherever torch is not installed.
"""
