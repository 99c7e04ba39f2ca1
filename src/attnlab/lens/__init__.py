"""Looking inside: explain a computation step by step, diagnose attention weights, diagnose
gradients; ablate and patch heads, rank them by importance, roll attention out over the
layers. Results are data (traces, diagnostics, tables); drawing them is
:mod:`attnlab.report`'s job.

    from attnlab import lens
    with lens.ablate(model, heads=[(3, 5)]):               # (layer, head), 0-based
        ...
    lens.patch(model, clean, corrupted, heads=[(3, 5)])
    lens.attention_rollout(weights)                       # (L, H, T, T) -> (T, T)
    lens.importance.head_importance(model, pairs)         # (L, H), Michel et al. 2019
    out, cache = lens.run_with_cache(model, x)            # every named hook point
    lens.run_with_hooks(model, x, hooks=[("blocks.0.attn.hook_z", fn)])
"""

from . import importance
from .ablation import ablate, head_means
from .cache import HookCache, hook_names, run_with_cache, run_with_hooks
from .hooks import hooked
from .importance import head_importance
from .patching import embedding_cosine, patch, patch_sweep, path_patch, token_cosine
from .rollout import attention_flow, attention_rollout

__all__ = ["HookCache", "ablate", "attention_flow", "attention_rollout", "embedding_cosine",
           "head_importance", "head_means", "hook_names", "hooked", "importance", "patch",
           "patch_sweep", "path_patch", "run_with_cache", "run_with_hooks", "token_cosine"]
