"""Fonts for CJK text in attnlab's figures: find one, use it, warn when there is none.

Every text attnlab draws uses the font fallback list ``["DejaVu Sans", <CJK font>]``,
so mixed labels such as ``"Query 小明"`` take Latin glyphs from DejaVu Sans and CJK
glyphs from the CJK font that :func:`find_cjk_font` located (Noto Sans CJK, Source Han
Sans, WenQuanYi, SimHei, ... or the file named by ``$ATTNLAB_CJK_FONT``). matplotlib is
imported inside the functions.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ..errors import AttnlabError, missing_extra

__all__ = ["CJK_FONT_ENV", "CJK_RE", "MissingCJKFontWarning", "clear_font_cache", "find_cjk_font",
           "font_context", "require_matplotlib", "warn_if_cjk_unrenderable"]

CJK_FONT_ENV = "ATTNLAB_CJK_FONT"
"""Environment variable: path to a font file with CJK glyphs, used before any search."""

_LATIN_FAMILY = "DejaVu Sans"  # ships with matplotlib, so it is always there
_CJK_FAMILIES = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans CJK TC",
    "Noto Sans CJK KR",
    "Noto Sans CJK HK",
    "Noto Serif CJK SC",
    "Noto Serif CJK JP",
    "Noto Serif CJK TC",
    "Source Han Sans SC",
    "Source Han Sans CN",
    "Source Han Sans",
    "Source Han Serif SC",
    "WenQuanYi Micro Hei",
    "WenQuanYi Zen Hei",
    "Droid Sans Fallback",
    "SimHei",
    "Microsoft YaHei",
    "PingFang SC",
    "Hiragino Sans GB",
    "Heiti SC",
    "STHeiti",
    "Songti SC",
    "SimSun",
    "Arial Unicode MS",
)
_PROBE = "学小明"  # a font must cover these to count as CJK-capable
CJK_RE = re.compile(
    "[\u2e80-\u2fff\u3000-\u30ff\u3100-\u31ff\u3200-\u9fff\uac00-\ud7af"
    "\uf900-\ufaff\ufe30-\ufe4f\uff00-\uffef\U00020000-\U0003ffff]"
)
_INSTALL_HINT = (
    "install one (Debian/Ubuntu: apt-get install fonts-noto-cjk) or set "
    f"{CJK_FONT_ENV}=/path/to/a/cjk/font.ttf"
)

class MissingCJKFontWarning(UserWarning):
    """Text with CJK characters is drawn but no font with CJK glyphs was found."""


# --------------------------------------------------------------------------- fonts


def require_matplotlib(feature: str = "Plotting") -> None:
    """Raise the ImportError that names the ``viz`` extra if matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise missing_extra("matplotlib", "viz", feature) from None


def _font_covers(fname: str, index: int, text: str) -> bool:
    """True if face ``index`` of the font file ``fname`` draws every char of ``text``:
    each one mapped, to a glyph of its own. A fallback font that maps whole Unicode
    blocks to one placeholder box (matplotlib >= 3.10 bundles "Last Resort", whose
    学, 小 and 明 are the same glyph) maps them all, but draws none of them."""
    from matplotlib import ft2font

    try:
        try:
            font = ft2font.FT2Font(fname, face_index=index)
        except TypeError:  # matplotlib < 3.10 has no face_index and opens face 0
            font = ft2font.FT2Font(fname)
    except (OSError, RuntimeError, ValueError):
        return False
    glyphs = [font.get_char_index(ord(char)) for char in text]
    return all(glyphs) and len(set(glyphs)) == len(set(text))


def _family_from_env(path_text: str) -> str:
    from matplotlib import font_manager

    path = Path(path_text).expanduser()
    if not path.is_file():
        raise AttnlabError(
            f"{CJK_FONT_ENV}: expected the path of a font file (.ttf, .otf, .ttc), "
            f"got {path_text!r}, which is not a file"
        )
    fname = os.fsdecode(path.resolve())
    if not _font_covers(fname, 0, _PROBE):
        raise AttnlabError(
            f"{CJK_FONT_ENV}: expected a font with CJK glyphs (for {', '.join(_PROBE)}), "
            f"got {path_text!r}, which lacks them or cannot be read"
        )
    entries = [e for e in font_manager.fontManager.ttflist if e.fname == fname]
    if not entries:
        # Registering is idempotent in effect: the font becomes findable by name.
        font_manager.fontManager.addfont(fname)
        entries = [e for e in font_manager.fontManager.ttflist if e.fname == fname]
    first = min(entries, key=lambda e: getattr(e, "index", 0))
    return str(first.name)


@functools.cache
def _find_cjk_font_cached(env_value: str | None) -> str | None:
    from matplotlib import font_manager

    if env_value:
        return _family_from_env(env_value)

    manager = font_manager.fontManager
    by_name: dict[str, list[Any]] = {}
    for entry in manager.ttflist:
        by_name.setdefault(entry.name, []).append(entry)
    for family in _CJK_FAMILIES:
        for entry in by_name.get(family, []):
            if _font_covers(entry.fname, getattr(entry, "index", 0), _PROBE):
                return family
    # Any other registered font that covers the probe (an unlisted CJK family).
    for entry in manager.ttflist:
        if _font_covers(entry.fname, getattr(entry, "index", 0), _PROBE):
            return str(entry.name)
    # matplotlib's font cache is built once; fonts installed after that (for example
    # by `apt-get install fonts-noto-cjk` on a machine that already ran matplotlib)
    # are missing from it, so look at the files on disk too.
    known = {entry.fname for entry in manager.ttflist}
    for fname in sorted(font_manager.findSystemFonts()):
        if fname in known or not _font_covers(fname, 0, _PROBE):
            continue
        manager.addfont(fname)
        return str(next(e.name for e in manager.ttflist if e.fname == fname))
    return None


def find_cjk_font() -> str | None:
    """Return the family name of a font with CJK glyphs, or None if there is none.

    Looks, in this order, at the font file named by ``$ATTNLAB_CJK_FONT`` (an error if
    that is set but not a readable CJK font), at well-known families (Noto Sans CJK
    SC/JP/TC/KR, Noto Serif CJK, Source Han Sans, WenQuanYi Micro/Zen Hei, SimHei,
    Microsoft YaHei, PingFang SC, ...), at every other font matplotlib knows, and at
    font files on disk that matplotlib's cache has not seen yet. A font counts only if
    its character map really covers 学, 小 and 明. Fonts found outside matplotlib's
    registry are added to it (``font_manager.fontManager.addfont``) so that the name
    can be used as a ``font.family``. The result is cached per value of the variable.

    Example: ``find_cjk_font()`` -> ``'Noto Sans CJK SC'`` on a machine with
    Debian's fonts-noto-cjk.
    """
    require_matplotlib()
    return _find_cjk_font_cached(os.environ.get(CJK_FONT_ENV) or None)


def clear_font_cache() -> None:
    """Forget :func:`find_cjk_font`'s cached answer, e.g. after installing a font."""
    _find_cjk_font_cached.cache_clear()


def _font_families() -> list[str]:
    """The fallback list every attnlab text uses: Latin first, then CJK if available."""
    cjk = find_cjk_font()
    return [_LATIN_FAMILY] if cjk is None else [_LATIN_FAMILY, cjk]


@contextlib.contextmanager
def font_context() -> Iterator[list[str]]:
    """Within the block, new matplotlib text uses attnlab's font fallback list.

    Yields the list, ``["DejaVu Sans", <CJK family>]`` (just ``["DejaVu Sans"]`` when
    no CJK font exists). Only ``rcParams["font.family"]`` changes, and it is restored
    on exit (``matplotlib.rc_context``); text objects keep the families they were
    created with, so figures built inside the block render correctly outside it.
    rcParams are process-wide: do not draw from other threads meanwhile.

    >>> from matplotlib.figure import Figure
    >>> with font_context() as families:
    ...     title = Figure().suptitle("Query 小明")
    >>> families[0]
    'DejaVu Sans'
    """
    require_matplotlib()
    import matplotlib

    families = _font_families()
    with matplotlib.rc_context({"font.family": families}):
        yield families


def warn_if_cjk_unrenderable(texts: Sequence[str], families: list[str], caller: str) -> None:
    """Warn (:class:`MissingCJKFontWarning`, naming ``caller``) if some of ``texts`` has
    CJK characters and ``families`` holds no CJK font."""
    if len(families) > 1:
        return
    cjk_texts = [text for text in texts if CJK_RE.search(text)]
    if cjk_texts:
        warnings.warn(
            MissingCJKFontWarning(
                f"{caller}: the labels or titles contain CJK characters (e.g. "
                f"{cjk_texts[0]!r}) but no font with CJK glyphs was found, so they will be "
                f"drawn as empty boxes; {_INSTALL_HINT}"
            ),
            stacklevel=3,
        )
