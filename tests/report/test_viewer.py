"""attnlab.report.viewer: the page is self-contained, escapes every token, and embeds the data.

These are static checks on the HTML text; tests/test_browser.py runs the page in a real
browser.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from pathlib import Path

import numpy as np
import pytest

import attnlab
import attnlab.report.viewer as viewer_module
from attnlab.errors import AttnlabError, ShapeError
from attnlab.lens.diagnostics import diagnose
from attnlab.report.viewer import (
    EXACT_LIMIT,
    AttentionView,
    decode_weights,
    encode_weights,
    render_html,
)

TOKENS = ["[CLS]", "小", "明", "去", "了", "学", "校", "[SEP]"]
INJECTED = "<img src=x onerror=alert(1)>"
SCRIPT_BREAK = "</script><script>alert(2)</script>"


def random_weights(L: int = 2, H: int = 3, T: int = 8, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(T, 0.5), size=(L, H, T))  # (L, H, T, T)


def embedded_json(page: str) -> dict:
    match = re.search(
        r'<script type="application/json" id="attnlab-data">(.*?)</script>', page, re.S
    )
    assert match is not None
    return json.loads(match.group(1))


def script_and_style(page: str) -> tuple[str, str]:
    scripts = re.findall(r"<script>(.*?)</script>", page, re.S)
    styles = re.findall(r"<style>(.*?)</style>", page, re.S)
    assert len(scripts) == 1 and len(styles) == 1
    return scripts[0], styles[0]


def csp_hash(source: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(source.encode()).digest()).decode()


@pytest.fixture(scope="module")
def hostile_page() -> str:
    tokens = TOKENS.copy()
    tokens[3], tokens[4] = INJECTED, SCRIPT_BREAK
    return render_html(random_weights(), tokens, title="<script>alert(3)</script> & co")


# ------------------------------------------------------------ self-contained


def markup_only(page: str) -> str:
    """The page without the JSON data (text the browser never parses as HTML)."""
    return re.sub(r'(id="attnlab-data">).*?(</script>)', r"\1\2", page, flags=re.S)


def test_page_references_nothing_on_the_network(hostile_page: str) -> None:
    assert "http://" not in hostile_page and "https://" not in hostile_page
    markup = re.sub(r"<script>.*?</script>", "", markup_only(hostile_page), flags=re.S)
    assert "//" not in markup  # no protocol-relative URL either
    targets = re.findall(r"""\b(?:src|href|action|srcset|data)\s*=\s*["']?([^"'\s>]*)""",
                         markup, re.I)
    assert targets == ["data:,"]  # only the empty favicon, so the browser asks for none
    assert "url(" not in hostile_page and "@import" not in hostile_page
    script, _ = script_and_style(hostile_page)
    # The PNG export's link is the one href: a blob: URL of the page's own canvas,
    # which the browser saves as a file (nothing is fetched or sent).
    hrefs = re.findall(r"[^\n]*href[^\n]*", script)
    assert [h.strip() for h in hrefs] == [
        "link.href = URL.createObjectURL(blob);",
        "setTimeout(function () { URL.revokeObjectURL(link.href); }, 1000);"]
    script = script.replace("link.href", "")
    for loader in ("src", "href", "fetch", "XMLHttpRequest", "import(", "WebSocket", "//",
                   "sendBeacon", "window.open"):
        assert loader not in script


def test_content_security_policy_allows_only_the_inline_code(hostile_page: str) -> None:
    script, style = script_and_style(hostile_page)
    match = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', hostile_page)
    assert match is not None
    policy = dict(part.strip().split(" ", 1) for part in match.group(1).split(";"))
    assert policy["default-src"] == "'none'"
    assert policy["script-src"] == f"'{csp_hash(script)}'"
    assert policy["style-src"] == f"'{csp_hash(style)}'"


def test_script_writes_text_only_never_markup(hostile_page: str) -> None:
    script, _ = script_and_style(hostile_page)
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "new Function", "setAttribute(\"style\""):
        assert sink not in script
    assert "textContent" in script


# ------------------------------------------------------------------- escaping


def test_injected_tokens_only_appear_inside_escaped_json(hostile_page: str) -> None:
    assert INJECTED not in hostile_page
    assert "<img" not in hostile_page.lower()
    assert "alert(2)</script>" not in hostile_page
    # Exactly the page's two script elements are closed: no token closed one early.
    assert hostile_page.count("</script>") == 2
    data_block = re.search(r'id="attnlab-data">(.*?)</script>', hostile_page, re.S)
    assert data_block is not None and "<" not in data_block.group(1)
    assert "\\u003cimg src=x onerror=alert(1)\\u003e" in data_block.group(1)


def test_tokens_round_trip_exactly_through_the_json(hostile_page: str) -> None:
    data = embedded_json(hostile_page)
    assert data["tokens"][3] == INJECTED and data["tokens"][4] == SCRIPT_BREAK
    assert data["key_tokens"] == data["tokens"]


def test_title_is_html_escaped(hostile_page: str) -> None:
    escaped = "&lt;script&gt;alert(3)&lt;/script&gt; &amp; co"
    assert f"<title>{escaped}</title>" in hostile_page
    assert f'<h1 id="view-title">{escaped}</h1>' in hostile_page
    assert "<script>alert(3)" not in hostile_page


# ----------------------------------------------------------------- the data


def unpack(encoded: dict, shape: tuple[int, ...]) -> np.ndarray:
    """The page's weights read by the documented format, written out independently:
    zlib(row maxima float32 (L, H, T), then (L, H, T, S) codes of `bits` bits), base64."""
    import base64
    import zlib

    L, H, T, S = shape
    blob = zlib.decompress(base64.b64decode(encoded["data"]))
    levels = 2 ** encoded["bits"] - 1
    code_type = {8: "u1", 16: "<u2"}[encoded["bits"]]
    assert len(blob) == 4 * L * H * T + np.dtype(code_type).itemsize * L * H * T * S
    row_max = np.frombuffer(blob[: 4 * L * H * T], "<f4").reshape(L, H, T, 1)
    codes = np.frombuffer(blob[4 * L * H * T:], code_type).reshape(L, H, T, S)
    return codes / levels * row_max.astype(np.float64)


def test_weights_and_diagnostics_are_embedded() -> None:
    weights = random_weights()
    data = embedded_json(render_html(weights, TOKENS))
    assert data["shape"] == [2, 3, 8, 8]
    assert data["weights"]["bits"] == 16
    # 16-bit codes of weight / row max: within row max / 131070 < 7.7e-6 (the page shows 4
    # decimals, so they are right).
    np.testing.assert_allclose(unpack(data["weights"], (2, 3, 8, 8)), weights, atol=7.7e-6)
    np.testing.assert_allclose(decode_weights(data["weights"], (2, 3, 8, 8)),
                               unpack(data["weights"], (2, 3, 8, 8)), rtol=0, atol=0)
    expected = diagnose(weights, TOKENS).to_dict()
    # each head's record as it is, plus the badges as the text table words them
    assert [{k: v for k, v in record.items() if k != "shown_flags"}
            for record in data["diagnostics"]["heads"]] == expected["heads"]
    assert data["diagnostics"]["layers"] == expected["layers"]


def test_given_diagnostics_are_used_and_checked() -> None:
    weights = np.zeros((1, 1, 4, 4))
    weights[0, 0, :, :3] = 1 / 3  # the last key is padding
    padded = diagnose(weights, key_padding=np.array([True, True, True, False]))
    data = embedded_json(render_html(weights, list("abcd"), diagnostics=padded))
    assert data["diagnostics"]["heads"][0]["entropy"] == pytest.approx(1.0)
    with pytest.raises(ShapeError, match=r"diagnostics: expected .* \(1, 1, 4, 4\)"):
        render_html(weights, list("abcd"), diagnostics=diagnose(random_weights(1, 2, 4)))
    with pytest.raises(AttnlabError, match="diagnostics: expected"):
        render_html(weights, list("abcd"), diagnostics={"heads": []})  # type: ignore[arg-type]


def test_stable_ids_for_scripts_and_tests() -> None:
    page = render_html(random_weights(), TOKENS)
    for element_id in ("layer-select", "head-select", "query-tokens", "key-tokens", "lines",
                       "heatmap", "diagnostics", "attnlab-view"):
        assert page.count(f'id="{element_id}"') == 1
    assert page == render_html(random_weights(), TOKENS)  # deterministic output


def test_chinese_interface() -> None:
    page = render_html(random_weights(), TOKENS, lang="zh")
    assert '<html lang="zh-CN">' in page and "注意力权重" in page
    words = embedded_json(page)["words"]
    assert words["layer_option"] == "第 {n} 层"
    # The legend names the flags exactly as the badges do.
    for flag in ("近似均匀", "过度稀疏", "停靠在特殊词元（sink）", "关注前一个词元"):
        assert flag in words["flag_text"].values() and flag in words["legend"]


def test_three_dimensional_weights_and_cross_attention() -> None:
    one_layer = render_html(random_weights(1, 2, 3)[0], ["a", "b", "c"])
    assert embedded_json(one_layer)["shape"] == [1, 2, 3, 3]
    cross = np.full((1, 1, 2, 3), 1 / 3)
    data = embedded_json(render_html(cross, ["q1", "q2"], key_tokens=["k1", "k2", "k3"]))
    assert data["key_tokens"] == ["k1", "k2", "k3"]


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "pattern"),
    [
        ((random_weights(), TOKENS[:3]), {}, AttnlabError, r"tokens: expected 8 labels"),
        ((random_weights(), "abcdefgh"), {}, AttnlabError, "tokens: expected a list"),
        ((np.full((1, 1, 2, 3), 1 / 3), ["a", "b"]), {}, AttnlabError,
         "key_tokens: expected 3 key labels"),
        ((random_weights(), TOKENS), {"lang": "fr"}, AttnlabError, "lang: expected"),
        ((random_weights(), TOKENS), {"title": 3}, AttnlabError, "title: expected a str"),
        ((random_weights() * 5, TOKENS), {}, AttnlabError, r"weights: expected .* \[0, 1\]"),
        ((np.ones(4), ["a"]), {}, ShapeError, "weights: expected"),
    ],
)
def test_bad_arguments_are_named(args: tuple, kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        render_html(*args, **kwargs)


# ---------------------------------------------------------- AttentionView


def test_view_saves_the_page(tmp_path: Path) -> None:
    view = AttentionView(random_weights(), TOKENS, title="小明")
    target = view.save(tmp_path / "out" / "viewer.html")
    assert target.read_text(encoding="utf-8") == view.html
    assert "<title>小明</title>" in view.html


def test_repr_html_is_a_sandboxed_iframe_with_a_unique_id() -> None:
    first = AttentionView(random_weights(), TOKENS)
    second = AttentionView(random_weights(seed=1), TOKENS)
    frames = [first._repr_html_(), second._repr_html_()]
    ids = [re.findall(r'<iframe id="([^"]+)"', frame)[0] for frame in frames]
    assert ids[0] != ids[1] and all(i.startswith("attnlab-view-") for i in ids)
    for frame, view in zip(frames, (first, second), strict=True):
        assert 'sandbox="allow-scripts allow-downloads"' in frame
        assert "allow-same-origin" not in frame
        srcdoc = re.search(r'srcdoc="([^"]*)"', frame)
        assert srcdoc is not None and html.unescape(srcdoc.group(1)) == view.html
        # No fixed height: the script beside the frame takes the height the page posts,
        # and only from that frame's own window.
        assert "e.source!==f.contentWindow" in frame and "attnlab-height" in frame


def test_view_from_trace() -> None:
    trace = attnlab.explain(tokens=["小明", "去了", "学校"], num_heads=2)
    view = AttentionView.from_trace(trace, lang="zh")
    data = embedded_json(view.html)
    assert data["shape"] == [1, 2, 3, 3] and data["tokens"] == ["小明", "去了", "学校"]
    np.testing.assert_allclose(unpack(data["weights"], (1, 2, 3, 3))[0], trace.weights(),
                               atol=7.7e-6)  # 16-bit codes, as above


def test_large_pages_use_8_bit_codes_within_their_bound(monkeypatch) -> None:
    rng = np.random.default_rng(3)
    weights = rng.dirichlet(np.full(300, 0.05), size=(1, 2, 300))  # (1, 2, 300, 300)
    monkeypatch.setattr(viewer_module, "EXACT_LIMIT", weights.size)
    assert encode_weights(weights)["bits"] == 16
    monkeypatch.setattr(viewer_module, "EXACT_LIMIT", weights.size - 1)
    encoded = encode_weights(weights)
    assert encoded["bits"] == 8
    row_max = weights.max(axis=-1, keepdims=True)
    error = np.abs(unpack(encoded, weights.shape) - weights)
    assert (error <= row_max / 510 + 1e-7).all()  # rounding to 255 levels of the row max
    # Rows whose weights are all tiny (a near-uniform head at T = 700) keep their shape:
    # codes are relative to the row's own max, not to 1.
    uniform = np.full((1, 1, 4, 700), 1 / 700)
    np.testing.assert_allclose(unpack(encode_weights(uniform), uniform.shape), uniform,
                               rtol=1e-6)
    assert EXACT_LIMIT >= 6 * 12 * 128 * 128 * 2  # pages up to T = 128 (and beyond) are exact


def test_rollout_importance_and_original_numbers_are_embedded() -> None:
    weights = random_weights()
    rollout = weights[1].mean(axis=0)
    importance = np.arange(6.0).reshape(2, 3)
    data = embedded_json(render_html(weights, TOKENS, layers=[1, 4], heads=[0, 5, 11],
                                     rollout=rollout, importance=importance))
    assert data["layer_numbers"] == [2, 5] and data["head_numbers"] == [1, 6, 12]
    np.testing.assert_allclose(unpack(data["rollout"], (1, 1, 8, 8))[0, 0], rollout,
                               atol=7.7e-6)
    assert data["importance"] == importance.tolist()


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"layers": [0]}, AttnlabError, r"layers: expected 2 0-based numbers"),
        ({"heads": [0, 1, -1]}, AttnlabError, r"heads: expected 3 0-based numbers"),
        ({"rollout": np.ones((8, 7)) / 7}, ShapeError, r"rollout: expected \(T, S\)"),
        ({"rollout": np.full((8, 8), 2.0)}, AttnlabError, r"rollout: expected finite values"),
        ({"importance": np.ones((3, 2))}, ShapeError, r"importance: expected \(L, H\)"),
        ({"importance": np.full((2, 3), np.nan)}, AttnlabError, "importance: expected finite"),
    ],
)
def test_bad_extras_are_named(kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        render_html(random_weights(), TOKENS, **kwargs)


def test_page_assets_are_package_data_files() -> None:
    """The CSS, JavaScript and page template ship as files an installed wheel carries."""
    import fnmatch
    from importlib import resources

    import tomllib

    root = Path(__file__).resolve().parents[2]
    globs = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["setuptools"]["package-data"]["attnlab"]
    assets = resources.files("attnlab.report").joinpath("assets")
    names = sorted(entry.name for entry in assets.iterdir() if entry.name.startswith("viewer."))
    assert names == ["viewer.css", "viewer.html", "viewer.js"]
    for name in names:
        assert any(fnmatch.fnmatch(f"report/assets/{name}", glob) for glob in globs), name
    script, style = script_and_style(render_html(random_weights(), TOKENS))
    assert script == assets.joinpath("viewer.js").read_text(encoding="utf-8").strip()
    assert style == assets.joinpath("viewer.css").read_text(encoding="utf-8").strip()


# ------------------------------------------------------------ decoders, pairs, neuron view


def causal_weights(L: int = 2, H: int = 4, T: int = 8, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.dirichlet(np.full(T, 0.5), size=(L, H, T)) * np.tril(np.ones((T, T)))
    return w / w.sum(axis=-1, keepdims=True)  # (L, H, T, T), zero above the diagonal


def test_decoder_options_are_embedded_and_round_trip() -> None:
    from attnlab.report.viewer_data import unpack_floats

    weights, T = causal_weights(), 8
    rng = np.random.default_rng(1)
    q, k = rng.normal(size=(2, 4, T, 5)), rng.normal(size=(2, 2, T, 5))
    norms = rng.uniform(0.1, 2.0, size=(2, 4, T))
    allowed = np.tril(np.ones((T, T), dtype=bool))
    data = embedded_json(render_html(
        weights, TOKENS, allowed=allowed, prompt_length=5, heads_per_kv=2,
        queries=q, keys=k, scales=[0.5, 0.25], value_norms=norms, start=(1, 3)))
    assert data["prompt_length"] == 5 and data["heads_per_kv"] == 2 and data["start"] == [1, 3]
    import zlib as _zlib
    bits = np.unpackbits(np.frombuffer(_zlib.decompress(base64.b64decode(data["allowed"])),
                                       dtype=np.uint8))[: T * T]
    assert (bits.reshape(T, T).astype(bool) == allowed).all()
    neuron = data["neuron"]
    assert neuron["layers"] == [0, 1] and neuron["D"] == 5 and neuron["kv_heads"] == 2
    assert neuron["scales"] == [0.5, 0.25]
    # float32 on the page: relative rounding 2**-24
    np.testing.assert_allclose(unpack_floats(neuron["q"], q.shape), q, rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(unpack_floats(neuron["k"], k.shape), k, rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(unpack_floats(data["value_norms"], norms.shape), norms,
                               rtol=1e-7)
    # The diagnostics know the mask: a causal row's entropy is over the keys it may see.
    assert data["diagnostics"]["heads"][0]["entropy"] is not None


def test_pairs_embed_their_segments() -> None:
    data = embedded_json(render_html(random_weights(), TOKENS, segments=[0] * 4 + [1] * 4))
    assert data["segments"] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"allowed": np.ones((8, 7), dtype=bool)}, ShapeError,
         r"allowed: expected bool \(T, S\)"),
        ({"allowed": np.eye(8, dtype=bool)}, AttnlabError,
         r"allowed: weights put .* \(l, h, t, s\)"),
        ({"prompt_length": 0}, AttnlabError, r"prompt_length: expected an int in \[1, 8\]"),
        ({"heads_per_kv": "2"}, AttnlabError, r"heads_per_kv: expected an int"),
        ({"segments": [0, 1, 2, 0, 0, 0, 0, 0]}, AttnlabError, r"segments: expected 8 sentence"),
        ({"queries": np.zeros((2, 3, 8, 4))}, AttnlabError, r"queries, keys, scales: expected all"),
        ({"queries": np.zeros((2, 3, 8, 4)), "keys": np.zeros((2, 2, 8, 4)), "scales": [1, 1]},
         ShapeError, r"keys: expected \(L, Hkv, S, D\)"),
        ({"value_norms": np.ones((2, 3, 7))}, ShapeError, r"value_norms: expected \(L, H, S\)"),
        ({"start": (2, 0)}, AttnlabError, r"start\[0\] \(layer\): expected an int in \[0, 1\]"),
        ({"colour": "red"}, AttnlabError, r"colour: not an option of the viewer"),
    ],
)
def test_bad_decoder_options_are_named(kwargs: dict, error: type, pattern: str) -> None:
    with pytest.raises(error, match=pattern):
        render_html(random_weights(), TOKENS, **kwargs)


def test_new_interface_words_exist_in_both_languages_and_the_notes_cite_their_sources() -> None:
    from attnlab.report.words import VIEWER_WORDS

    assert set(VIEWER_WORDS["en"]) == set(VIEWER_WORDS["zh"])
    for lang in ("en", "zh"):
        note = VIEWER_WORDS[lang]["norms_note"]
        for source in ("Jain", "Wallace 2019", "Wiegreffe", "Pinter 2019", "Kobayashi"):
            assert source in note, (lang, source)
        assert "2023" in VIEWER_WORDS[lang]["sink_note"]  # StreamingLLM's attention sinks
    page = render_html(causal_weights(), TOKENS, allowed=np.tril(np.ones((8, 8), bool)),
                       lang="zh")
    assert "神经元视图" in page and "保存 PNG" in page


def _previous_token_weights(T: int = 8) -> np.ndarray:
    """(1, 2, T, T): head 0 one-hot on the previous token (row 0 on itself), head 1 one-hot
    on the first token (over-sparse, and no positional pattern)."""
    weights = np.zeros((1, 2, T, T))
    for t in range(T):
        weights[0, 0, t, max(t - 1, 0)] = 1.0
    weights[0, 1, :, 0] = 1.0
    return weights


def test_badges_word_a_positional_head_as_the_text_table_does() -> None:
    """A previous-token head is one-hot by design: the page's badges, like the text table,
    say so instead of "over-sparse"; a one-hot head with no positional pattern stays
    over-sparse."""
    from attnlab.report.text import diagnostics_table

    weights = _previous_token_weights()
    diagnostics = diagnose(weights, TOKENS)
    positional, plain = diagnostics.heads
    assert "over_sparse" in positional.flags and "previous_token" in positional.flags
    heads = embedded_json(render_html(weights, TOKENS))["diagnostics"]["heads"]
    assert heads[0]["shown_flags"] == [
        "over_sparse_positional" if f == "over_sparse" else f for f in positional.flags]
    assert "over_sparse" in heads[1]["shown_flags"]
    assert heads[0]["flags"] == positional.flags  # the data keeps the raw flags too
    table = diagnostics_table(diagnostics)
    assert "one-hot by position" in table.splitlines()[2]
