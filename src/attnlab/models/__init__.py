"""Real pretrained models running on attnlab's own attention.

Example (needs ``attnlab[minilm]``)::

    from attnlab.models import load_minilm
    model = load_minilm()
    model.encode(["小明去了学校"]).shape        # (1, 384)
    trace = model.run("小明去了学校", keep="all")   # per-layer, per-head Q, K, V, weights...
"""

from __future__ import annotations

from .bert import BertModel
from .config import BertConfig, ModelFileError
from .loading import REQUIRED_FILES, load_bert, load_minilm, minilm_path

__all__ = ["BertConfig", "BertModel", "ModelFileError", "REQUIRED_FILES", "load_bert",
           "load_minilm", "minilm_path"]
