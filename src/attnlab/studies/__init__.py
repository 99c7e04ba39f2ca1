"""Measurements: benchmarks, the accuracy/speed study of approximate attention, and the
profile of where a model's time goes, all built on :mod:`~attnlab.studies.measure`.
"""
