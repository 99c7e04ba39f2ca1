"""Real pretrained models on attnlab.torch blocks: trainable ``nn.Module`` twins of
:mod:`attnlab.models`, loaded from the same files.

Example (needs ``attnlab[minilm]``)::

    from attnlab.torch.models import load_minilm
    model = load_minilm(max_length=128)          # an nn.Module, in eval mode
    model.encode(["小明去了学校"]).shape           # torch.Size([1, 384])
    save_pretrained(model, "my-minilm/")         # a folder transformers and
                                                 # sentence-transformers load
"""

from __future__ import annotations

from .bert import BertLayer, BertModel, load_bert, load_minilm
from .save import hf_state_dict, save_pretrained

__all__ = ["BertLayer", "BertModel", "hf_state_dict", "load_bert", "load_minilm",
           "save_pretrained"]
