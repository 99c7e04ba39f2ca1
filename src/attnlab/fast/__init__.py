"""Fast paths: each computes what the plain path in :mod:`attnlab.attention` computes,
and is tested against it (its plain twin).

- :mod:`~attnlab.fast.flash`: tiled attention with an online softmax, O(T + S) memory;
  :mod:`~attnlab.fast.flash_walk` is that online softmax in a few plain lines, step by step;
- :mod:`~attnlab.fast.kv_cache`: cached keys and values for decoding;
- :mod:`~attnlab.fast.paged_cache`: many sequences' keys and values in blocks of one pool;
- :mod:`~attnlab.fast.varlen`: packed batches of sequences of different lengths, no padding;
- :mod:`~attnlab.fast.sparse`: sliding-window attention;
- :mod:`~attnlab.fast.block_sparse`: block-sparse (BigBird) attention;
- :mod:`~attnlab.fast.lowrank`: Linformer and Nyström approximations;
- :mod:`~attnlab.fast.performer`: the Performer (FAVOR+) approximation.
"""
