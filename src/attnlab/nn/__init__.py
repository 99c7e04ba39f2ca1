"""Modules built from the core: multi-head attention, the layers around it and a tiny decoder.

Classes are the boxes of the paper (``MultiHeadAttention``, ``FeedForward``,
``EncoderBlock``); weights are plain NumPy arrays, and the backward passes of
each module live in :mod:`~attnlab.nn.backward`.
"""
