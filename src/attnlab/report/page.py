"""What every offline HTML page of attnlab shares: data embedded safely, scripts pinned.

- :func:`script_json`: JSON for a ``<script type="application/json">`` element with every
  ``<``, ``>`` and ``&`` written as ``\\u003c``, ``\\u003e``, ``\\u0026``, so that no token,
  title or label can close the element or open a new one.
- :func:`csp_hash`: the ``'sha256-…'`` source of an inline script or style, for a
  Content-Security-Policy that allows the page's own code and nothing else.

>>> script_json({"token": "</script>"})
'{"token":"\\\\u003c/script\\\\u003e"}'
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

__all__ = ["csp_hash", "script_json"]


def script_json(payload: Any) -> str:
    """JSON that is safe inside <script>: no '<', '>' or '&' can end or open anything."""
    text = json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def csp_hash(source: str) -> str:
    """``sha256-<base64>`` of an inline script or style, as a CSP source expects it."""
    digest = hashlib.sha256(source.encode("utf-8")).digest()
    return "sha256-" + base64.b64encode(digest).decode("ascii")
