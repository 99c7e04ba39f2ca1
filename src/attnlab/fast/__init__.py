"""Fast paths: each computes what the plain path in :mod:`attnlab.attention` computes,
and is tested against it (its plain twin).

- :mod:`~attnlab.fast.flash`: tiled attention with an online softmax, O(T + S) memory;
- :mod:`~attnlab.fast.kv_cache`: cached keys and values for decoding;
- :mod:`~attnlab.fast.sparse`: sliding-window and block-sparse attention;
- :mod:`~attnlab.fast.lowrank`: Linformer, Nyström and Performer approximations.
"""
