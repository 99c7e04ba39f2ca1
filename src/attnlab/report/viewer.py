"""An interactive attention viewer: one self-contained HTML page.

:func:`render_html` turns weights ``(L, H, T, S)`` (L layers, H heads, T query length,
S key length) and their tokens into a page that opens from disk in any browser:

- choose the layer and the head (``#layer-select``, ``#head-select``), or click a
  thumbnail of the overview (``#overview``: every head at once, with layer and head
  filters ``#layer-filter``, ``#head-filter``);
- a BertViz-style head view: queries on the left, keys on the right
  (``.token.query[data-index=i]``, ``.token.key[data-index=j]``); hovering (or
  focusing) a query draws its lines to every key with opacity = weight, and shades the
  keys by weight; hovering a key does the same for the queries that look at it;
  clicking a query token selects it (several may be selected at once; their lines stay);
- a heatmap of the chosen head drawn on a canvas (``canvas#heatmap``, one cell per
  weight, so a 512 × 512 head is as quick as an 8 × 8 one); hovering a token or a cell
  highlights its row (``.row-highlight[data-row]``) or its column
  (``.col-highlight[data-col]``) and the cell's value shows in ``#cell-tip``;
- optional panels: attention rollout (T, S) and head importance (L, H), from
  :mod:`attnlab.lens`, beside the weights;
- the :mod:`attnlab.lens.diagnostics` of that head and layer beside it.

Compact data
------------
The weights travel as bytes, not as JSON numbers: each row is divided by its largest
weight and rounded to an unsigned integer code (16 bits while the page holds at most
:data:`EXACT_LIMIT` weights, 8 bits beyond), the row maxima go first as float32, and the
whole is compressed with zlib and written in base64; the page decompresses it with the
browser's own ``DecompressionStream``. A weight is recovered to within row max / (2 ·
(2**bits - 1)): 7.6e-6 with 16 bits (the 4 decimals the page shows are right), 0.002 with
8 bits (the page then shows 3 decimals and says so). A page for 6 × 12 heads at T = 512
is about 10–11 MB (the uncompressed JSON of the same weights would be ~150 MB).

Self-contained and safe by construction
---------------------------------------
- No CDN, no network, no external file: CSS and vanilla JavaScript are inline (in the
  package they are data files, ``assets/viewer.css``, ``viewer.js`` and the page
  template ``viewer.html``, read once with :mod:`importlib.resources`), and the data is
  embedded as JSON in ``<script type="application/json">`` with every ``<``, ``>`` and
  ``&`` written as ``\\u003c``, ``\\u003e``, ``\\u0026`` (so no token can close the
  script element).
- Every token is inserted with ``textContent`` (never ``innerHTML``): a token such as
  ``<img src=x onerror=alert(1)>`` is shown as text and never runs. The title is
  escaped with :func:`html.escape`.
- A Content-Security-Policy allows only the page's own script and style (by SHA-256
  hash) and no network at all, as a second line of defence.

In Jupyter, :class:`AttentionView` displays itself (``_repr_html_``) inside a sandboxed
``<iframe srcdoc>``: each view is its own document, so several views on one notebook
page share no ids, styles or scripts (each iframe also gets a unique id).

>>> import numpy as np
>>> page = render_html(np.full((1, 1, 2, 2), 0.5), ["<b>", "&"])
>>> page.startswith("<!DOCTYPE html>"), "<b>" in page
(True, False)
"""

from __future__ import annotations

import base64
import functools
import html
import itertools
import os
import zlib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..checks import as_float_array, check_text, make_folder, shape_str
from ..errors import AttnlabError, ShapeError
from ..lens.diagnostics import Diagnostics, diagnose
from ..lens.weight_checks import check_weights
from .page import page_csp, script_json
from .text import check_lang, shown_flags
from .viewer_data import viewer_extras
from .words import VIEWER_WORDS, Lang

if TYPE_CHECKING:
    from ..trace import Trace

__all__ = ["AttentionView", "EXACT_LIMIT", "decode_weights", "encode_weights", "render_html"]

#: Up to this many weights (L·H·T·S) a page stores 16-bit codes (exact to the 4 decimals
#: it shows); above it, 8-bit codes keep a T = 512 page of 6 × 12 heads near 10 MB.
EXACT_LIMIT = 4_000_000
_ROW_PX = 22  # height of one token row in the head view (the lines are drawn to match)
_view_ids = itertools.count(1)



@functools.cache
def _asset(name: str) -> str:
    """A file of ``attnlab/report/assets`` (package data), read once."""
    return resources.files(__package__).joinpath(f"assets/{name}").read_text(encoding="utf-8")


def render_html(
    weights: Any,
    tokens: Sequence[str],
    *,
    key_tokens: Sequence[str] | None = None,
    diagnostics: Diagnostics | None = None,
    title: str | None = None,
    lang: Lang = "en",
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    rollout: Any = None,
    importance: Any = None,
    **decoder: Any,
) -> str:
    """One self-contained HTML page showing every head of ``weights``.

    Args:
        weights: (L, H, T, S) attention weights in [0, 1] (rows sum to 1), or (H, T, S).
        tokens: T query labels (also the key labels when S == T and ``key_tokens`` is None).
        key_tokens: S key labels, for cross-attention.
        diagnostics: the :class:`~attnlab.lens.diagnostics.Diagnostics` to show; by default
            ``diagnose(weights, tokens, key_tokens=key_tokens)``. Pass your own to account
            for padding or a causal mask.
        title: page title (default "Attention viewer" / "注意力查看器").
        lang: "en" or "zh" for the interface text.
        layers, heads: the model's own (0-based) numbers of the L layers and H heads shown,
            when they are a selection; the page labels them as the model does, counted
            from 1 ("Layer 5" is ``layers=[4]``). Default: 0..L-1 and 0..H-1.
        rollout: (T, S) attention rollout (:func:`attnlab.lens.attention_rollout`), drawn
            beside the weights; rows in [0, 1].
        importance: (L, H) head importance (any non-negative score), shown as a table,
            e.g. each head's ablation effect (:func:`attnlab.lens.hf_lens.ablation_effects`,
            ``run_hf(..., ablation=True)``: how much the output changes when it is zeroed).
        **decoder: decoders, pairs, the neuron and norms views and the opening head:
            ``allowed`` (T, S) bool (True = may attend; the rest is hatched),
            ``prompt_length``, ``heads_per_kv``, ``segments``, ``queries`` /
            ``keys`` / ``scales``, ``value_norms``, ``start``; see
            :func:`attnlab.report.viewer_data.viewer_extras`.

    Returns:
        The page as a string; write it with :meth:`AttentionView.save` or open it in a
        browser. (L, H, T, S) -> str.
    """
    check_lang(lang)
    if title is not None and not isinstance(title, str):
        raise AttnlabError(f"title: expected a str or None, got {type(title).__name__}")
    if title is not None:
        check_text(title, "title")
    w = check_weights(weights)  # (L, H, T, S)
    L, H, T, S = w.shape
    query_labels = _labels(tokens, "tokens", T, "T")
    if key_tokens is not None:
        key_labels = _labels(key_tokens, "key_tokens", S, "S")
    elif S == T:
        key_labels = query_labels
    else:
        raise AttnlabError(
            f"key_tokens: expected {S} key labels since S = {S} differs from T = {T}, got None"
        )
    known = {"allowed", "prompt_length", "heads_per_kv", "segments", "queries", "keys",
             "scales", "value_norms", "start"}
    unknown = sorted(set(decoder) - known)
    if unknown:
        raise AttnlabError(f"{unknown[0]}: not an option of the viewer (expected one of "
                           f"{', '.join(sorted(known))})")
    decoder_fields, allowed = viewer_extras(w, **decoder)
    if diagnostics is None:
        diagnostics = diagnose(w, query_labels, key_tokens=key_labels, mask=allowed)
    elif not isinstance(diagnostics, Diagnostics):
        raise AttnlabError(
            f"diagnostics: expected attnlab.lens.diagnostics.Diagnostics or None, got "
            f"{type(diagnostics).__name__}"
        )
    elif diagnostics.shape != w.shape:
        raise ShapeError(
            f"diagnostics: expected diagnostics of weights (L, H, T, S) = {shape_str(w.shape)}, "
            f"got {shape_str(diagnostics.shape)}"
        )

    layer_numbers = _numbers(layers, "layers", L)
    head_numbers = _numbers(heads, "heads", H)
    extras: dict[str, Any] = {}
    if rollout is not None:
        flow = as_float_array(rollout, "rollout")
        if flow.shape != (T, S):
            raise ShapeError(f"rollout: expected (T, S) = {shape_str((T, S))}, "
                             f"got {shape_str(flow.shape)}")
        if not (np.isfinite(flow).all() and flow.min() >= -1e-6 and flow.max() <= 1 + 1e-6):
            raise AttnlabError("rollout: expected finite values in [0, 1], got "
                               f"[{flow.min():.4g}, {flow.max():.4g}]")
        extras["rollout"] = encode_weights(np.clip(flow, 0, 1)[None, None])
    if importance is not None:
        extras["importance"] = _importance(importance, L, H)

    words = VIEWER_WORDS[lang]
    payload = {
        "shape": [L, H, T, S],
        "tokens": query_labels,
        "key_tokens": key_labels,
        "layer_numbers": layer_numbers,
        "head_numbers": head_numbers,
        "weights": encode_weights(w),
        **extras,
        **decoder_fields,
        "diagnostics": _diagnostics_data(diagnostics),
        "words": words,
        "row_px": _ROW_PX,
    }
    css, js = _asset("viewer.css").strip(), _asset("viewer.js").strip()
    csp = page_csp(css, js)
    page_title = html.escape(title if title is not None else words["title"])
    text = {key: html.escape(str(words[key])) for key in (
        "layer", "head", "head_view", "head_view_hint", "queries", "keys", "heatmap",
        "heatmap_hint", "diagnostics", "overview", "overview_hint", "rollout",
        "rollout_hint", "importance", "importance_hint", "loading", "needs_js",
        "neuron_view", "neuron_hint", "export_png", "step", "measure", "segments",
        "overlay_heads", "sink_title")}
    return _asset("viewer.html").format(
        lang_attr="zh-CN" if lang == "zh" else "en",
        csp=csp,
        title=page_title,
        css=css,
        js=js,
        data=script_json(payload),
        layer_label=text["layer"],
        head_label=text["head"],
        **{k: v for k, v in text.items() if k not in ("layer", "head")},
    )


class AttentionView:
    """The viewer page for one set of weights: shows itself in Jupyter, saves to disk.

    >>> import numpy as np
    >>> view = AttentionView(np.full((2, 3, 4, 4), 0.25), ["[CLS]", "a", "b", "[SEP]"])
    >>> view.html.count('<script type="application/json"')
    1
    """

    def __init__(
        self,
        weights: Any,
        tokens: Sequence[str],
        *,
        key_tokens: Sequence[str] | None = None,
        diagnostics: Diagnostics | None = None,
        title: str | None = None,
        lang: Lang = "en",
        layers: Sequence[int] | None = None,
        heads: Sequence[int] | None = None,
        rollout: Any = None,
        importance: Any = None,
        **decoder: Any,
    ) -> None:
        # Read the labels once: a generator would be empty the second time.
        tokens = _as_list(tokens, "tokens")
        key_tokens = None if key_tokens is None else _as_list(key_tokens, "key_tokens")
        self.html = render_html(weights, tokens, key_tokens=key_tokens,
                                diagnostics=diagnostics, title=title, lang=lang,
                                layers=layers, heads=heads, rollout=rollout,
                                importance=importance, **decoder)
        self.title = title
        self._rows = max(len(tokens), len(key_tokens or tokens))

    @classmethod
    def from_trace(
        cls,
        trace: Trace,
        *,
        diagnostics: Diagnostics | None = None,
        title: str | None = None,
        lang: Lang = "en",
    ) -> AttentionView:
        """The view of every ``weights`` step of a :class:`attnlab.Trace`."""
        return cls(trace.attention(), trace.tokens, key_tokens=trace.key_tokens,
                   diagnostics=diagnostics, title=title, lang=lang)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the page (UTF-8) to ``path``, creating its folder; returns the path."""
        if not isinstance(path, (str, os.PathLike)):
            raise AttnlabError(f"path: expected a str or os.PathLike, got {type(path).__name__}")
        target = Path(path)
        make_folder(target.parent, "path")
        try:
            target.write_text(self.html, encoding="utf-8")
        except OSError as exc:
            raise AttnlabError(f"path: cannot write {os.fspath(path)!r} "
                               f"({exc.strerror or exc})") from None
        return target

    def _repr_html_(self) -> str:
        # A sandboxed iframe is a document of its own: ids, styles and scripts of several
        # views on one notebook page cannot collide, and the page cannot touch the notebook.
        # It cannot be measured from outside either (no same origin): the page posts its
        # own height, and the small script beside the frame sets the frame to it, only
        # for messages from that frame's window. The first height is a guess.
        height = min(900, max(420, 190 + self._rows * _ROW_PX))
        frame_id = f"attnlab-view-{next(_view_ids)}-{os.urandom(4).hex()}"
        label = html.escape(self.title or "attention viewer", quote=True)
        fit = (
            "(function(){var f=document.getElementById('" + frame_id + "');"
            "window.addEventListener('message',function(e){"
            "if(!f||e.source!==f.contentWindow||!e.data||e.data.type!=='attnlab-height')"
            "{return;}var h=Math.ceil(Number(e.data.height));"
            "if(h>0&&h<100000){f.style.height=h+'px';}});})();"
        )
        return (
            f'<iframe id="{frame_id}" class="attnlab-view" '
            f'sandbox="allow-scripts allow-downloads" title="{label}" '
            f'style="width:100%;height:{height}px;border:0" '
            f'srcdoc="{html.escape(self.html, quote=True)}"></iframe>'
            f"<script>{fit}</script>"
        )


def encode_weights(weights: np.ndarray) -> dict[str, Any]:
    """(L, H, T, S) weights in [0, 1] -> the page's compact form (see the module doc).

    ``{"bits": 8 | 16, "data": base64(zlib(row maxima as float32 (L, H, T), then the codes
    (L, H, T, S) as little-endian unsigned integers)))}``.
    """
    w = np.asarray(weights, dtype=np.float64)
    bits = 16 if w.size <= EXACT_LIMIT else 8
    levels = (1 << bits) - 1
    row_max = w.max(axis=-1, initial=0.0).astype(np.float32)  # (L, H, T)
    divisor = np.where(row_max > 0, row_max, 1.0)[..., None].astype(np.float64)
    codes = np.rint(np.clip(w / divisor, 0.0, 1.0) * levels)  # (L, H, T, S)
    blob = row_max.astype("<f4").tobytes() + codes.astype("<u2" if bits == 16 else "u1").tobytes()
    return {"bits": bits, "data": base64.b64encode(zlib.compress(blob, 6)).decode("ascii")}


def decode_weights(encoded: dict[str, Any], shape: Sequence[int]) -> np.ndarray:
    """The inverse of :func:`encode_weights` (what the page's script computes), float64."""
    L, H, T, S = shape
    blob = zlib.decompress(base64.b64decode(encoded["data"]))
    rows = L * H * T
    row_max = np.frombuffer(blob, dtype="<f4", count=rows).reshape(L, H, T, 1)
    dtype = "<u2" if encoded["bits"] == 16 else "u1"
    codes = np.frombuffer(blob, dtype=dtype, offset=4 * rows).reshape(L, H, T, S)
    return codes / ((1 << encoded["bits"]) - 1) * row_max.astype(np.float64)


def _diagnostics_data(diagnostics: Diagnostics) -> dict[str, Any]:
    """The diagnostics as the page reads them: each head's badges are its flags as the
    text table shows them (:func:`~attnlab.report.text.shown_flags`: a positional head's
    one-hot rows are not called over-sparse); the tokens are the page's own."""
    found = {**diagnostics.to_dict(), "tokens": None, "key_tokens": None}
    found["heads"] = [{**record, "shown_flags": shown_flags(record["flags"])}
                      for record in found["heads"]]
    return found


def _numbers(given: Sequence[int] | None, name: str, size: int) -> list[int]:
    """The 1-based labels of the shown layers / heads (``given`` holds 0-based numbers)."""
    if given is None:
        return list(range(1, size + 1))
    if isinstance(given, (str, bytes)) or not hasattr(given, "__iter__"):
        raise AttnlabError(f"{name}: expected {size} 0-based numbers, got {given!r}")
    items = list(given)
    if len(items) != size or not all(
            isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 0
            for n in items):
        raise AttnlabError(f"{name}: expected {size} 0-based numbers (one per shown "
                           f"{name[:-1]}), got {items!r}")
    return [int(n) + 1 for n in items]


def _importance(importance: Any, L: int, H: int) -> list[list[float]]:
    try:
        scores = np.asarray(importance, dtype=np.float64)
    except (TypeError, ValueError):
        raise AttnlabError(f"importance: expected an (L, H) = ({L}, {H}) array of numbers, "
                           f"got {type(importance).__name__}") from None
    if scores.shape != (L, H):
        raise ShapeError(f"importance: expected (L, H) = {shape_str((L, H))}, "
                         f"got {shape_str(scores.shape)}")
    if not np.isfinite(scores).all():
        raise AttnlabError("importance: expected finite numbers, got NaN or ±inf")
    return np.round(scores, 6).tolist()


def _as_list(tokens: Any, name: str) -> Any:
    """A one-pass iterable of labels (a generator) as a list; anything else as it is."""
    if tokens is None or isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        return tokens  # refused with the expected size by _labels
    return list(tokens)


def _labels(tokens: Any, name: str, size: int, dim: str) -> list[str]:
    if tokens is None or isinstance(tokens, (str, bytes)) or not hasattr(tokens, "__iter__"):
        raise AttnlabError(
            f"{name}: expected a list of {size} token strings ({dim} = {size}), got {tokens!r}"
        )
    items = [check_text(str(t), f"{name}[{i}]") for i, t in enumerate(tokens)]
    if len(items) != size:
        raise AttnlabError(f"{name}: expected {size} labels ({dim} = {size}), got {len(items)}")
    return items


