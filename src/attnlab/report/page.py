"""What every offline HTML page of attnlab shares: data embedded safely, scripts pinned.

- :func:`script_json`: JSON for a ``<script type="application/json">`` element with every
  ``<``, ``>`` and ``&`` written as ``\\u003c``, ``\\u003e``, ``\\u0026``, so that no token,
  title or label can close the element or open a new one.
- :func:`csp_hash`: the ``'sha256-…'`` source of an inline script or style, for a
  Content-Security-Policy that allows the page's own code and nothing else.
- :func:`page_csp`: that policy for a page with one inline script and one inline style.

>>> script_json({"token": "</script>"})
'{"token":"\\\\u003c/script\\\\u003e"}'
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

__all__ = ["csp_hash", "page_csp", "script_json"]


def script_json(payload: Any) -> str:
    """JSON that is safe inside <script>: no '<', '>' or '&' can end or open anything."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def csp_hash(source: str) -> str:
    """``sha256-<base64>`` of an inline script or style, as a CSP source expects it."""
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "sha256-" + base64.b64encode(digest).decode("ascii")


def page_csp(css: str, js: str) -> str:
    """The Content-Security-Policy of a page whose only code is the inline style ``css``
    and script ``js``: those two by hash, images as data: URLs, nothing else."""
    return (
        "default-src 'none'; "
        f"script-src '{csp_hash(js)}'; style-src '{csp_hash(css)}'; img-src data:; "
        "base-uri 'none'; form-action 'none'"
    )
