"""Looking inside: explain a computation step by step, diagnose attention weights, diagnose
gradients. Results are data (traces, diagnostics); drawing them is :mod:`attnlab.report`'s job.
"""
