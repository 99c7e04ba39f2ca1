# ruff: noqa: E501  (a message catalog: a sentence reads best on one line)
"""Keyed messages: every error and user-facing line is a key plus parameters, rendered
in English or Chinese (gettext style). Nothing is translated by matching English text.

How to use it
-------------
1. Add the key to :data:`MESSAGES` with both languages; the templates are
   ``str.format`` strings over the same named fields::

       "cli.timeout": ("--timeout: expected seconds > 0, got {got}",
                       "--timeout：需要 > 0 的秒数，实际得到 {got}"),

   ``tests/core/test_messages.py`` checks that every key has both languages, that
   the two templates use the same fields, and that every key the source names exists.
2. Raise it: ``raise AttnlabError(msg("cli.timeout", got=-1))``
   (:class:`attnlab.errors.AttnlabError` and the CLI's ``CliError`` take a
   :class:`Message` where they took a string; ``str(error)`` is the English and
   ``error.message`` the :class:`Message`).
3. Show it: ``message.render("zh")``; the command line renders an error's message
   in the language of ``--lang`` (:func:`render_error`).

Parameters are values (numbers, names, reprs), which stay as they are in both
languages, or other :class:`Message` objects (a phrase such as "an int seed >= 0"),
which are rendered in the same language as the message holding them, or a
:class:`Listing` of either, joined with that language's separator.

Names stay as they are in Chinese: argument names, Q, K, V, softmax, file names.

The catalog is split by area, each area's keys joining :data:`MESSAGES` here: the
studies' tables, notes and plots are in :mod:`attnlab.messages.studies`, the
exercises' verdicts and hints in :mod:`attnlab.messages.exercises`.

A message can travel inside a JSON report as data, ``{"key": ..., "params": {...}}``
(:meth:`Message.as_dict`), and be rendered later in either language
(:func:`render_value`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .exercises import EXERCISE_MESSAGES
from .studies import STUDY_MESSAGES

__all__ = ["MESSAGES", "LANGS", "Listing", "Message", "msg", "render", "render_error",
           "render_value"]

LANGS = ("en", "zh")
Language = Literal["en", "zh"]

#: key -> (English template, Chinese template).
MESSAGES: dict[str, tuple[str, str]] = {
    # ---- phrases used as parameters of other messages
    "phrase.seed": ("an int seed >= 0", "≥ 0 的整数种子"),
    "phrase.int": ("int", "整数"),
    "phrase.float": ("float", "数字"),
    "phrase.error": ("error: {text}", "错误：{text}"),
    # ---- the generic checks of attnlab.errors
    "check.none": ("{name}: expected an array, got None", "{name}：需要一个数组，实际得到 None"),
    "check.expected_got": ("{name}: expected {what}, got {got}", "{name}：需要{what}，实际得到 {got}"),
    "check.dtype_bool": ("{name}: expected a numeric array, got dtype bool", "{name}：需要数值数组，实际得到 bool 类型"),
    "check.dtype_real": ("{name}: expected a real float or integer array, got dtype {dtype}", "{name}：需要实数浮点或整数数组，实际得到 {dtype} 类型"),
    "check.requires_grad": ("{name}: expected a NumPy array, got a {type} that requires grad; pass {name}.detach() to the NumPy core, or use attnlab.torch to keep the gradient",
                            "{name}：需要 NumPy 数组，实际得到需要梯度的 {type}；请把 {name}.detach() 传给 NumPy 核心，或用 attnlab.torch 保留梯度"),
    "check.unreadable": ("{name}: could not be read as {what} ({detail})", "{name}：无法读作{what}（{detail}）"),
    "check.what.array": ("an array", "数组"),
    "check.what.numeric_array": ("a numeric array", "数值数组"),
    "check.finite": ("{name}: expected finite values, got {count} non-finite (first: {kind} at index {index})",
                     "{name}：需要有限值，实际有 {count} 个非有限值（第一个：位置 {index} 上的 {kind}）"),
    "check.ndim": ("{name}: expected {layout}, got {shape}", "{name}：需要 {layout}，实际形状为 {shape}"),
    "check.integer": ("{name}: expected an integer, got {type} {got}", "{name}：需要整数，实际得到 {type} {got}"),
    "check.integer_at_least": ("{name}: expected an integer >= {low}, got {got}", "{name}：需要 ≥ {low} 的整数，实际得到 {got}"),
    "check.broadcast": ("{name}: expected a shape broadcastable to {layout} = {target}, got {shape}",
                        "{name}：需要能广播到 {layout} = {target} 的形状，实际为 {shape}"),
    "check.flag": ("{name}: expected True or False, got {got}", "{name}：需要 True 或 False，实际得到 {got}"),
    "check.scale_type": ("{name}: expected a real number or None, got {got}", "{name}：需要实数或 None，实际得到 {got}"),
    "check.scale_finite": ("{name}: expected a finite number, got {got}", "{name}：需要有限的数，实际得到 {got}"),
    "check.utf8": ("{name}: expected text that can be written as UTF-8, got {got} with the lone surrogate {char} at index {index} (undecodable bytes?); decode the bytes with errors='replace' first",
                   "{name}：需要能写成 UTF-8 的文本，实际得到 {got}，其中位置 {index} 有孤立的代理字符 {char}（无法解码的字节？）；请先用 errors='replace' 解码"),
    "check.alloc": ("{name}: {what} = {shape} would hold {count} elements ({gib} GiB), more than attnlab's limit of {limit} (attnlab.checks.MAX_ELEMENTS); use smaller sizes",
                    "{name}：{what} = {shape} 将有 {count} 个元素（{gib} GiB），超过 attnlab 的上限 {limit}（attnlab.checks.MAX_ELEMENTS）；请用更小的尺寸"),
    "check.folder_is_file": ("{name}: expected a folder, got {path}, which is a file", "{name}：需要一个文件夹，但 {path} 是一个文件"),
    "check.folder_blocked": ("{name}: cannot create the folder {path}: {blocking} is a file", "{name}：无法创建文件夹 {path}：{blocking} 是一个文件"),
    "check.folder_failed": ("{name}: cannot create the folder {path} ({detail})", "{name}：无法创建文件夹 {path}（{detail}）"),
    "check.bool_mask": ("{name}: expected a bool array (True = may attend), got dtype {dtype}. For a 0/1 mask use attnlab.masks.from_keep(m) (1 = may attend) or attnlab.masks.from_blocked(m) (1 = blocked, as in seed 000); additive values belong in bias=",
                        "{name}：需要 bool 数组（True = 可以关注），实际为 {dtype} 类型。0/1 掩码请用 attnlab.masks.from_keep(m)（1 = 可以关注）或 attnlab.masks.from_blocked(m)（1 = 屏蔽，同原文 000）；加性的值请传给 bias="),
    "check.missing_extra": ("{feature} needs the '{module}' package, which is not installed. Install it with: pip install 'attnlab[{extra}]'",
                            "{feature}需要 '{module}' 包，但它没有安装。请用 pip install 'attnlab[{extra}]' 安装"),
    "check.rng_type": ("rng: expected a numpy.random.Generator, an int seed >= 0 or None, got {type} {got}",
                       "rng：需要 numpy.random.Generator、≥ 0 的整数种子或 None，实际得到 {type} {got}"),
    # ---- the kernel's score-range check
    "kernel.raw_overflow": ("{names}: the scores q·kᵀ could reach {raw} before scaling (D·max|q|·max|k| with D = {D}, max|q| = {q_max}, max|k| = {k_max}), beyond {dtype}'s largest value {limit}: they would overflow to inf and give NaN; {advice}",
                            "{names}：缩放之前的分数 q·kᵀ 可能达到 {raw}（D·max|q|·max|k|，其中 D = {D}，max|q| = {q_max}，max|k| = {k_max}），超过 {dtype} 的最大值 {limit}：会溢出为 inf 并得到 NaN；{advice}"),
    "kernel.scaled_overflow": ("{names}: the scaled scores could reach {bound} (D·max|q|·max|k|·|scale| with D = {D}, max|q| = {q_max}, max|k| = {k_max}, scale = {scale}), beyond {dtype}'s largest value {limit}: they would overflow to inf and give NaN; {advice}",
                               "{names}：缩放后的分数可能达到 {bound}（D·max|q|·max|k|·|scale|，其中 D = {D}，max|q| = {q_max}，max|k| = {k_max}，scale = {scale}），超过 {dtype} 的最大值 {limit}：会溢出为 inf 并得到 NaN；{advice}"),
    "kernel.advice": ("scale q and k down", "请把 q 和 k 缩小"),
    "kernel.advice_float64": ("scale q and k down, or compute in float64", "请把 q 和 k 缩小，或改用 float64 计算"),
    # ---- edges of the kernels, caches, merges and ring (each argument named)
    "shape.k_width": ("k: expected (..., S, {D}) to match q's last dim {D}, got {shape}",
                      "k：需要 (..., S, {D})，与 q 的最后一维 {D} 一致，实际形状为 {shape}"),
    "shape.v_length": ("v: expected (..., {S}, Dv) to match k's length S = {S}, got {shape}",
                       "v：需要 (..., {S}, Dv)，与 k 的长度 S = {S} 一致，实际形状为 {shape}"),
    "shape.batch": ("q, k, v: expected leading (batch) dims that broadcast together, got q {q}, k {k}, v {v}",
                    "q, k, v：需要能相互广播的前导（批）维度，实际得到 q {q}、k {k}、v {v}"),
    "shape.score_elements": ("q, k: the score matrix {shape} would hold {count} elements, more than the plain path's limit of {limit} (attnlab.checks.MAX_ELEMENTS); {hint}",
                             "q, k：分数矩阵 {shape} 将有 {count} 个元素，超过朴素路径的上限 {limit}（attnlab.checks.MAX_ELEMENTS）；{hint}"),
    "shape.hint_flash": ("attnlab.flash_attention computes this tile by tile in O(T + S) memory",
                         "attnlab.flash_attention 逐块计算，只需 O(T + S) 内存"),
    "shape.module_query": ("{name}: expected (B, T, {E}) or (T, {E}) with E = d_model, got {shape}",
                           "{name}：需要 (B, T, {E}) 或 (T, {E})，E = d_model，实际形状为 {shape}"),
    "shape.module_context": ("{name}: expected ({lead}S, {width}) to match {query}'s batch and {what} = {width}, got {shape}",
                             "{name}：需要 ({lead}S, {width})，与 {query} 的批大小和 {what} = {width} 一致，实际形状为 {shape}"),
    "shape.module_length": ("{name}: expected ({lead}{S}, {width}) to match {keys_name}'s length, got {shape}",
                            "{name}：需要 ({lead}{S}, {width})，与 {keys_name} 的长度一致，实际形状为 {shape}"),
    "shape.key_padding": ("key_padding: expected bool {expected} (True = real token), got {got}",
                          "key_padding：需要形状为 {expected} 的 bool 数组（True = 真实词元），实际得到 {got}"),
    "shape.positions_range": ("{name}: expected positions in [0, {S}), got {got}",
                              "{name}：需要 [0, {S}) 内的位置，实际得到 {got}"),
    "shape.positions_distinct": ("{name}: expected distinct positions, got {got}",
                                 "{name}：需要互不相同的位置，实际得到 {got}"),
    "kernel.alibi_ndim": ("alibi_slopes: expected (H,) or (B, H), got {shape}",
                          "alibi_slopes：需要 (H,) 或 (B, H)，实际形状为 {shape}"),
    "kernel.sinks_ndim": ("sinks: expected one logit per head (H,), got {shape}",
                          "sinks：需要每个头一个 logit (H,)，实际形状为 {shape}"),
    "kernel.sinks_heads": ("sinks: expected one logit per head of q (..., H, T, D), (H,) = {heads}, got {shape}",
                           "sinks：需要 q (..., H, T, D) 的每个头一个 logit，(H,) = {heads}，实际形状为 {shape}"),
    "kernel.alibi_range": ("alibi_slopes: expected |slope|·(T + S) below {limit} (a quarter of {dtype}'s largest value) so that the bias -slope·|i' - j| stays finite, got max|slope| = {slope} with T + S = {length}",
                           "alibi_slopes：需要 |slope|·(T + S) 小于 {limit}（{dtype} 最大值的四分之一），使偏置 -slope·|i' - j| 保持有限，实际 max|slope| = {slope}，T + S = {length}"),
    "sparse.window_required": ("window: expected an int W or a pair (left, right) (a sliding window needs one), got None",
                               "window：需要整数 W 或一对 (left, right)（滑动窗口必须给出窗口），实际得到 None"),
    "flash.merge_unweighable": ("lse1, lse2: expected log-sum-exps that can weigh the two parts, got {lse1} and {lse2} at row {row}: a finite fill this large over a whole row leaves each part's key count below float64's rounding of its lse; mask those keys with a boolean mask (an empty part has lse -inf and merges exactly) or use a fill of magnitude at most 1e6",
                                "lse1, lse2：需要能为两部分定权重的 log-sum-exp，实际在第 {row} 行得到 {lse1} 和 {lse2}：整行都是这么大的有限填充值时，每部分键的个数已小于 float64 对其 lse 的舍入；请用布尔掩码屏蔽这些键（没有键的部分 lse 为 -inf，可以精确合并），或使用绝对值不超过 1e6 的填充值"),
    "paged.block_id": ("blocks: expected block ids in 0..{last} (this pool's), got {got}", "blocks：需要 0..{last} 之间的块编号（本池的），实际得到 {got}"),
    "paged.block_free": ("blocks: expected blocks in use, got {block}, which is already free (given back twice)", "blocks：需要正在使用的块，实际得到 {block}，它已经空闲（归还了两次）"),
    "varlen.total_int64": ("lengths: expected a total length that fits int64 (at most {limit}), got {got}", "lengths：需要能放进 int64 的总长度（至多 {limit}），实际得到 {got}"),
    "ring.unshard_kind": ("parts[{index}]: expected a shard of the kind of parts[0] ({kind}), got {got}", "parts[{index}]：需要与 parts[0] 同类的分片（{kind}），实际得到 {got}"),
    "lens.whole_positions": ("positions: expected whole token indices, got {got}", "positions：需要整数的词元下标，实际得到 {got}"),
    "train.head_pairs": ("{name}: expected (layer, head) pairs of ints, got {got}", "{name}：需要由整数组成的 (layer, head) 对，实际得到 {got}"),
    # ---- explain
    "explain.rope_d_k": ("d_k: pos='rope' rotates pairs of features, expected an even d_k, got {got}", "d_k：pos='rope' 成对旋转特征，需要偶数的 d_k，实际得到 {got}"),
    "explain.fused_heads": ("num_heads: split='fused' divides E = {E} into {H} heads (seed 001's assert d_model % h == 0), got a remainder {remainder}",
                            "num_heads：split='fused' 把 E = {E} 平分给 {H} 个头（原文 001 的 assert d_model % h == 0），余数为 {remainder}"),
    "explain.fused_d_k": ("d_k: split='fused' uses d_k = E / H = {d_k}, got {got}", "d_k：split='fused' 使用 d_k = E / H = {d_k}，实际得到 {got}"),
    "explain.x_empty": ("X: expected at least one token and one feature, got {shape}", "X：至少需要一个词元和一个特征，实际形状为 {shape}"),
    # ---- the distributed layouts
    "ring.length": ("{name}: the {layout} layout cuts the sequence into {rule} = {chunks} equal chunks, so the length must be a multiple of {chunks}, got {T}; pad it to {padded} (attnlab.distributed.padded_length) and pass key_padding False on the padding",
                    "{name}：{layout} 布局把序列切成 {rule} = {chunks} 个等长的块，所以长度必须是 {chunks} 的倍数，实际为 {T}；请填充到 {padded}（attnlab.distributed.padded_length），并在填充处把 key_padding 设为 False"),
    "ring.kv_heads": ("--kv-heads: expected a divisor of --heads {heads}, got {kv_heads}", "--kv-heads：需要能整除 --heads {heads} 的数，实际得到 {kv_heads}"),
    "ring.out_needs_simulate": ("--out: writes the simulation's figure, so it needs --simulate", "--out：写出的是模拟的图，需要同时给出 --simulate"),
    # ---- the lens
    "lens.link": ("{name}: expected two tokens joined by '->' such as 'it->animal', got {got}", "{name}：需要用 '->' 连接的两个词元，例如 'it->animal'，实际得到 {got}"),
    "lens.link_type": ("{name}: expected text such as 'it->animal', got {type}", "{name}：需要文本，例如 'it->animal'，实际得到 {type}"),
    "lens.not_a_token": ("{name}: expected one of the text's tokens, got {got} (the tokens are: {tokens})", "{name}：需要文本中的一个词元，实际得到 {got}（词元为：{tokens}）"),
    # ---- the command line
    "cli.wrote": ("wrote {path}", "已写入 {path}"),
    "cli.no_plot": ("note: no plot ({reason})", "说明：未画图（{reason}）"),
    "cli.text_or_study": ("text: expected a TEXT, or --study (not both)", "text：需要一段 TEXT，或者 --study（二者不能同时给出）"),
    "cli.text_needed": ("text: expected a TEXT, or --study", "text：需要一段 TEXT，或者 --study"),
    "cli.numbers_in": ("{flag}: expected numbers in 1..{count}, got {got}", "{flag}：需要 1..{count} 之间的数，实际得到 {got}"),
    "cli.int_list": ("{flag}: expected comma-separated integers like {example}, got {got}", "{flag}：需要用逗号分隔的整数，例如 {example}；实际得到 {got}"),
    "cli.positive_ints": ("{flag}: expected positive integers like {example}, got {got}", "{flag}：需要正整数，例如 {example}；实际得到 {got}"),
    "cli.file_not_found": ("{flag}: file not found: {path}", "{flag}：找不到文件：{path}"),
    "cli.not_npy": ("{flag}: {path} is not a .npy file (no NumPy header)", "{flag}：{path} 不是 .npy 文件（没有 NumPy 文件头）"),
    "cli.bad_npy": ("{flag}: could not read {path} as a .npy array ({detail})", "{flag}：无法把 {path} 读作 .npy 数组（{detail}）"),
    "cli.bad_csv": ("{flag}: could not read {path} as a numeric CSV ({detail})", "{flag}：无法把 {path} 读作数值 CSV（{detail}）"),
    "cli.empty_csv": ("{flag}: {path} holds no numbers", "{flag}：{path} 里没有数字"),
    "cli.matrix": ("{flag}: expected a matrix like '1,0,1,0; 0,2,0,2' or '[[1,0],[0,1]]' or a .npy/.csv file, got {got}",
                   "{flag}：需要一个矩阵，例如 '1,0,1,0; 0,2,0,2' 或 '[[1,0],[0,1]]'，或一个 .npy/.csv 文件；实际得到 {got}"),
    "cli.matrix_2d": ("{flag}: expected a 2-D matrix (rows = tokens), got shape {shape}", "{flag}：需要二维矩阵（每行一个词元），实际形状为 {shape}"),
    "cli.empty_field": ("{flag}: row {number} of {text} has an empty field ({row}); expected numbers separated by commas, rows by ';'",
                        "{flag}：{text} 的第 {number} 行有空的字段（{row}）；数字之间用逗号分隔，行之间用 ';' 分隔"),
    "cli.empty_row": ("{flag}: row {number} of {text} has an empty row ({row}); expected numbers separated by commas, rows by ';'",
                      "{flag}：{text} 的第 {number} 行是空行（{row}）；数字之间用逗号分隔，行之间用 ';' 分隔"),
    "cli.folder_empty": ("{flag}: expected a folder, got an empty string", "{flag}：需要一个文件夹，实际得到空字符串"),
    "cli.folder_is_file": ("{flag}: expected a folder, got {path}, which is a file", "{flag}：需要一个文件夹，但 {path} 是一个文件"),
    "cli.folder_failed": ("{flag}: could not create the folder {path} ({detail})", "{flag}：无法创建文件夹 {path}（{detail}）"),
    "cli.folder_readonly": ("{flag}: the folder {path} is not writable", "{flag}：文件夹 {path} 不可写"),
    "cli.memory": ("{flag}: {what} needs about {need} GiB, more than this machine's {total} GiB of memory; use smaller sizes",
                   "{flag}：{what}大约需要 {need} GiB，超过本机的 {total} GiB 内存；请用更小的尺寸"),
    "cli.no_memory": ("not enough memory: {detail}; use smaller sizes", "内存不足：{detail}；请用更小的尺寸"),
    "cli.os_error": ("{detail}", "{detail}"),
    "cli.internal": ("internal error: {type}: {detail}", "内部错误：{type}：{detail}"),
    "cli.tokens_empty": ("--tokens: expected at least one token, got an empty string", "--tokens：至少需要一个词元，实际得到空字符串"),
    "cli.precision": ("--precision: expected 0..12, got {got}", "--precision：需要 0..12，实际得到 {got}"),
    "cli.padding": ("--padding: expected {count} values of 1 (a real token) or 0 (padding), one per token, like {example}, got {got}",
                    "--padding：需要 {count} 个值，每个词元一个，1 表示真实词元、0 表示填充，例如 {example}；实际得到 {got}"),
    "cli.text_empty": ("{flag}: expected some text, got an empty string", "{flag}：需要一段文本，实际得到空字符串"),
    "cli.max_length": ("--max-length: expected a number of tokens >= 1, got {got}", "--max-length：需要 ≥ 1 的词元数，实际得到 {got}"),
    "cli.prefixed": ("{flag}: {inner}", "{flag}：{inner}"),
    "cli.lens_model_text_only": ("--model: the lens on a Hugging Face decoder takes one TEXT (no --pair, no --study)", "--model：对 Hugging Face 解码器使用透镜时只接受一段 TEXT（不能用 --pair 或 --study）"),
    "cli.lens_model_decoder": ("--model: {model} is not a causal language model; the lens runs on BERT folders (attnlab's own BERT) and on decoders", "--model：{model} 不是因果语言模型；透镜可以用于 BERT 文件夹（attnlab 自己的 BERT）和解码器"),
    "cli.lens_model_short": ("text: expected at least 2 tokens (a next token to predict), got {count}", "text：至少需要 2 个词元（要有可预测的下一个词元），实际只有 {count} 个"),
    "cli.lens_hf_only": ("{flag}: only for --model with a Hugging Face decoder folder (the lens on attnlab's own BERT has no {flag})", "{flag}：只用于 --model 给出的 Hugging Face 解码器文件夹（attnlab 自己的 BERT 透镜没有 {flag}）"),
    "cli.lens_needs_corrupted": ("--analysis {analysis}: expected --corrupted OTHER, a corrupted version of TEXT with as many tokens", "--analysis {analysis}：需要 --corrupted OTHER，即与 TEXT 词元数相同的被破坏版本"),
    "cli.lens_corrupted_tokens": ("--corrupted: expected as many tokens as TEXT ({want}), got {got}", "--corrupted：需要与 TEXT 相同的词元数（{want}），实际得到 {got}"),
    "cli.lens_flag_for": ("{flag}: only used with --analysis {analysis}, got --analysis {got}", "{flag}：只在 --analysis {analysis} 时使用，实际 --analysis 为 {got}"),
    "cli.lens_flag_needed": ("{flag}: expected with --analysis {analysis} (heads as LAYER.HEAD, numbered from 1, like {example})", "{flag}：--analysis {analysis} 需要它（头写成 LAYER.HEAD，从 1 开始编号，例如 {example}）"),
    "cli.lens_head_spec": ("{flag}: expected heads as LAYER.HEAD with layers 1..{layers} and heads 1..{heads}, like {example}, got {got}", "{flag}：头要写成 LAYER.HEAD，层为 1..{layers}，头为 1..{heads}，例如 {example}；实际得到 {got}"),
    "cli.lens_receivers_after": ("--receivers: expected heads in layers after the sender's (layer {layer}), got {got}", "--receivers：需要位于发送头所在层（第 {layer} 层）之后的头，实际得到 {got}"),
    "cli.generate_count": ("--generate: expected a number of tokens >= 0, got {got}", "--generate：需要 ≥ 0 的词元数，实际得到 {got}"),
    "cli.generate_or_pair": ("--generate: expected either --generate or --pair, got both", "--generate：--generate 和 --pair 只能二选一，实际两个都给了"),
    "hf.not_a_folder": ("{name}: expected a Hugging Face folder (config.json, weights, tokenizer) or a hub name, got {got}", "{name}：需要一个 Hugging Face 模型文件夹（config.json、权重、分词器）或 Hub 上的模型名，实际得到 {got}"),
    "hf.hub_unreachable": ("{name}: cannot load {got} from the Hugging Face hub (offline or unknown: {detail}); give a local folder", "{name}：无法从 Hugging Face Hub 加载 {got}（离线或不存在：{detail}）；请给出本地文件夹"),
    "hf.folder_unreadable": ("{name}: cannot load the folder {got} ({detail})", "{name}：无法加载文件夹 {got}（{detail}）"),
    "hf.lens_no_unembed": ("model: {model} has no final norm and unembedding that the logit lens knows (a causal language model is needed)", "model：{model} 没有 logit lens 认得的最终归一化层和反嵌入层（需要因果语言模型）"),
    "hf.dla_norm": ("model: the final norm {norm} is neither a LayerNorm nor an RMSNorm of the form weight · x / rms(x): cannot freeze its scale for the direct logit attribution", "model：最终归一化层 {norm} 既不是 LayerNorm，也不是 weight · x / rms(x) 形式的 RMSNorm：无法为直接 logit 归因冻结它的缩放"),
    "hf.neuron_softcap": ("note: no neuron view for {model}: layer {layer} caps its scores (softcap {cap}: score = {cap}·tanh(q·k·scale/{cap})), so q·k × scale is not the score the weights came from", "注意：{model} 没有神经元视图：第 {layer} 层对分数做了上限压缩（softcap {cap}：分数 = {cap}·tanh(q·k·scale/{cap})），q·k × 缩放 不是得到权重的那个分数"),
    "hf.neuron_scale": ("note: no neuron view for {model}: in layer {layer} the scores are not q·k × one scale (off by up to {error}: a bias, a cap or another scale), so the view would show wrong scores", "注意：{model} 没有神经元视图：第 {layer} 层的分数不是 q·k × 一个缩放（最多相差 {error}：有偏置、上限压缩或别的缩放），视图会显示错误的分数"),
    "hf.encoder_generate": ("{name}: {model} is an encoder (no language-model head); --generate needs a decoder", "{name}：{model} 是编码器（没有语言模型头）；--generate 需要解码器"),
    "cli.pair_with_study": ("--pair: not with --study (the study reads the shipped pairs)", "--pair：不能与 --study 同用（研究读取随包提供的句子对）"),
    "cli.d_model_with_x": ("--d-model: only used with --tokens and no --x (the width of the toy embeddings), got --d-model {got} with --x", "--d-model：只在给 --tokens、不给 --x 时使用（玩具嵌入向量的宽度），实际在给了 --x 时得到 --d-model {got}"),
    "cli.draw_sizes": ("{flag}: only used when drawing dataflow (it sizes the shapes), got NAME {names}", "{flag}：只在画 dataflow 时使用（决定图中的形状），实际得到的 NAME 为 {names}"),
    "cli.d_model_no_tokens": ("--d-model: only used with --tokens and no --x (the width of the toy embeddings), got --d-model {got} with no --tokens", "--d-model：只在给 --tokens、不给 --x 时使用（玩具嵌入向量的宽度），实际在没有 --tokens 时得到 --d-model {got}"),
    "cli.too_much_to_print": ("--x/--tokens/--d-model/--heads/--d-k: explain prints every matrix, and T = {T} tokens, E = {E}, {H} head(s) of d_k = {D} would print {count} numbers, more than {limit}; use smaller sizes, or attnlab.explain() from Python",
                              "--x/--tokens/--d-model/--heads/--d-k：explain 打印每一个矩阵，T = {T} 个词元、E = {E}、{H} 个 d_k = {D} 的头将打印 {count} 个数，超过 {limit}；请用更小的尺寸，或在 Python 中调用 attnlab.explain()"),
    "cli.positive": ("{flag}: expected a positive integer, got {got}", "{flag}：需要正整数，实际得到 {got}"),
    "cli.timeout": ("--timeout: expected seconds > 0, got {got}", "--timeout：需要 > 0 的秒数，实际得到 {got}"),
    "cli.task_needed": ("train: expected a TASK (one of {tasks}) or --study", "train：需要一个任务 TASK（{tasks} 之一）或 --study"),
    "cli.task_or_study": ("train: expected a TASK or --study, not both", "train：需要一个任务 TASK 或 --study，二者不能同时给出"),
    "cli.names_from": ("{flag}: expected names from {names}, got {got}", "{flag}：需要从 {names} 中选取的名字，实际得到 {got}"),
    "cli.profile_scores": ("--seq-lens/--batch: T = {T} with batch {batch} and {heads} heads needs a score matrix of {count} elements, more than the limit of {limit} (attnlab.attention.MAX_SCORE_ELEMENTS)",
                           "--seq-lens/--batch：T = {T}、批大小 {batch}、{heads} 个头需要 {count} 个元素的分数矩阵，超过上限 {limit}（attnlab.attention.MAX_SCORE_ELEMENTS）"),
    "cli.profile_what": ("T = {T} with batch {batch} ({heads} heads)", "T = {T}、批大小 {batch}（{heads} 个头）"),
    "cli.approx_threads": ("--threads: expected 0 (leave unchanged) or more, got {got}", "--threads：需要 0（不改动）或更大的数，实际得到 {got}"),
    "cli.approx_long": ("--long: expected 0 (skip) or a length, got {got}", "--long：需要 0（跳过）或一个长度，实际得到 {got}"),
    "cli.number_at_least_0": ("{flag}: expected a number >= 0, got {got}", "{flag}：需要 ≥ 0 的数，实际得到 {got}"),
    "cli.approx_exact_at": ("exact attention at T = {T}", "T = {T} 时的精确注意力"),
    "cli.approx_dense_at": ("dense attention at T = {T}", "T = {T} 时的稠密注意力"),
    # ---- attnlab verify (attnlab.hf.verify's report)
    "verify.no_model": ("MODEL_DIR: expected a model folder with config.json, got {got}", "MODEL_DIR：需要一个含 config.json 的模型文件夹，实际得到 {got}"),
    "verify.unreadable": ("MODEL_DIR: transformers could not read {path}: {detail}", "MODEL_DIR：transformers 无法读取 {path}：{detail}"),
    "verify.title": ("attnlab verify: {model}, {dtype}, batch {B} × {T} tokens", "attnlab verify（核对）：{model}，{dtype}，批 {B} × {T} 个词元"),
    "verify.padded": (" (padded)", "（含填充）"),
    "verify.reference": ("reference: attnlab's plain path in float64; rounding budget = 2 × {baseline}'s error (FlashAttention's rule)",
                         "参考：attnlab 的朴素路径（float64）；舍入预算 = {baseline} 误差的 2 倍（FlashAttention 的规则）"),
    "verify.legend": ("hidden states: max |h − h_float64| over real tokens; weights: max over heads (worst head)",
                      "隐藏状态：真实词元上的 max |h − h_float64|；权重：各头中的最大值（最差的头）"),
    "verify.layer": ("layer", "层"),
    "verify.budget": ("budget", "预算"),
    "verify.weights": ("weights {name}", "权重 {name}"),
    "verify.first": ("first layer past the budget: {items}", "第一个超出预算的层：{items}"),
    "verify.none": ("none", "无"),
    "verify.verdict": ("verdict: {items}", "结论：{items}"),
    "verify.rounding": ("rounding", "舍入误差"),
    "verify.bug": ("BUG (beyond rounding)", "错误（超出舍入误差）"),
    "verify.unavailable": ("not available for this model", "此模型不支持"),
    "verify.eager_not_finite": ("note: eager is not finite on real tokens (it upcasts softmax to float32; float64 with padding gives NaN): {baseline} is the baseline",
                                "注：eager 在真实词元上不是有限值（它把 softmax 提升到 float32；float64 加填充会得到 NaN）：改用 {baseline} 作基线"),
    "verify.unavailable_note": ("note: {name} is not available for this model", "注：此模型不支持 {name}"),
    # ---- argparse's own errors (the command line's parser raises them with these keys)
    "argparse.invalid_choice": ("argument {arg}: invalid choice: {got} (choose from {choices})", "参数 {arg}：无效的选择 {got}（可选：{choices}）"),
    "argparse.invalid_value": ("argument {arg}: invalid {type} value: {got}", "参数 {arg}：{got} 不是有效的{type}"),
    "argparse.one_argument": ("argument {arg}: expected one argument", "参数 {arg}：需要一个值"),
    "argparse.required": ("the following arguments are required: {args}", "缺少必需的参数：{args}"),
    "argparse.unrecognized": ("unrecognized arguments: {args}", "无法识别的参数：{args}"),
    "argparse.other": ("{detail}", "{detail}"),
    # ---- the trainer
    "train.diverged": ("training diverged at step {step} ({what}); the last finite loss was {last_loss} at step {last_step}; try a smaller --lr (it was {lr}); metrics.json written to {path}",
                       "训练在第 {step} 步发散（{what}）；最后一个有限的损失是第 {last_step} 步的 {last_loss}；请用更小的 --lr（本次为 {lr}）；metrics.json 已写入 {path}"),
    "train.diverged_nowhere": ("training diverged at step {step} ({what}), before any finite loss; try a smaller --lr (it was {lr}); metrics.json written to {path}",
                               "训练在第 {step} 步发散（{what}），此前没有任何有限的损失；请用更小的 --lr（本次为 {lr}）；metrics.json 已写入 {path}"),
    "train.next_output_weights": ("weights: expected (B, L, H, T, T) attention weights, got shape {shape}", "weights：需要形状为 (B, L, H, T, T) 的注意力权重，实际形状 {shape}"),
    "train.next_output_rows": ("inputs, targets: expected shape {expected} each, got {inputs} and {targets}", "inputs、targets：各需要形状 {expected}，实际得到 {inputs} 和 {targets}"),
    "train.next_output_prompt": ("prompt_len: expected at most T = {T}, got {got}", "prompt_len：最多为 T = {T}，实际得到 {got}"),
    "train.next_output_unscored": ("targets: expected at least one scored position (not IGNORE), got none", "targets：至少需要一个计分位置（不是 IGNORE），实际一个也没有"),
    "train.best_next_output": ("best next-output head (weight on the prompt digit emitted next): layer {layer} head {head}, score {score} (uniform attention scores about {uniform})",
                               "最佳“下一个输出”头（对下一个要输出的提示数字的权重）：第 {layer} 层第 {head} 个头，得分 {score}（均匀注意力约为 {uniform}）"),
    "train.generic_not_applicable": ("previous-token, duplicate-token and induction scores do not apply to {task} and are not shown (they stay in metrics.json)",
                                     "前一个词、重复词和归纳得分不适用于 {task} 任务，这里不显示（仍写在 metrics.json 中）"),
    "train.loss_nonfinite": ("the loss became {loss}", "损失变为 {loss}"),
    "train.weights_nonfinite": ("the update made the weights inf or NaN", "这一步更新使权重变为 inf 或 NaN"),
    "draw.d_model_heads": ("d_model: expected a multiple of num_heads = {heads} (each head gets d_model / num_heads columns), got {got}", "d_model：需要是 num_heads = {heads} 的倍数（每个头分到 d_model / num_heads 列），实际得到 {got}"),
    "train.d_model_heads": ("d_model: expected a multiple of num_heads = {heads} (or pass head_dim), got {got}", "d_model：需要是 num_heads = {heads} 的倍数（或者给出 head_dim），实际得到 {got}"),
    "train.rope_even": ("head_dim: RoPE rotates pairs, expected an even D, got {got}", "head_dim：RoPE 成对旋转特征，需要偶数的 D，实际得到 {got}"),
    "train.finite_positive": ("{name}: expected a finite number > 0, got {got}", "{name}：需要 > 0 的有限数，实际得到 {got}"),
    "train.needs_torch": ("attnlab train needs PyTorch, which is not installed. Install it with: pip install 'attnlab[torch]'",
                          "attnlab train 需要 PyTorch，但它没有安装。请用 pip install 'attnlab[torch]' 安装"),
    # ---- models
    "models.not_a_dir": ("path: expected a model directory, got {got}", "path：需要一个模型文件夹，实际得到 {got}"),
    "models.missing_files": ("path: {name} is missing {missing} (a BERT directory needs {needed})", "path：{name} 缺少 {missing}（BERT 模型文件夹需要 {needed}）"),
    "models.max_length": ("{name}: expected an integer in 1..{limit} (max_position_embeddings), got {got}", "{name}：需要 1..{limit} 之间的整数（max_position_embeddings），实际得到 {got}"),
}


for _area in (STUDY_MESSAGES, EXERCISE_MESSAGES):
    if set(_area) & set(MESSAGES):
        raise KeyError(f"message keys defined twice: {sorted(set(_area) & set(MESSAGES))}")
    MESSAGES.update(_area)


@dataclass(frozen=True)
class Message:
    """A key of :data:`MESSAGES` and its parameters; ``str()`` is the English."""

    key: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def render(self, lang: str = "en") -> str:
        """The message in ``lang`` ("en" or "zh"); nested messages in the same language."""
        templates = MESSAGES.get(self.key)
        if templates is None:
            raise KeyError(f"no message with the key {self.key!r} in attnlab.messages.MESSAGES")
        template = templates[1] if lang == "zh" else templates[0]
        values = {name: value.render(lang) if isinstance(value, (Message, Listing)) else value
                  for name, value in self.params.items()}
        return template.format(**values)

    def __str__(self) -> str:
        return self.render("en")

    def as_dict(self) -> dict[str, Any]:
        """``{"key": key, "params": {...}}``, nested messages as dicts too: JSON-ready
        when the parameters are; :func:`render_value` renders it back."""
        return {"key": self.key,
                "params": {name: value.as_dict() if isinstance(value, Message) else value
                           for name, value in self.params.items()}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Message:
        """The message :meth:`as_dict` wrote (nested ones included)."""
        params = {name: cls.from_dict(value) if _is_message_dict(value) else value
                  for name, value in data.get("params", {}).items()}
        return msg(data["key"], **params)


@dataclass(frozen=True)
class Listing:
    """A parameter that lists items (text or messages), joined in the language of the
    message holding it: "; " or "；" (``comma``: ", " or "，")."""

    items: Sequence[Any]
    comma: bool = False

    def render(self, lang: str = "en") -> str:
        """The items in ``lang``, joined."""
        if lang == "zh":
            sep = "，" if self.comma else "；"
        else:
            sep = ", " if self.comma else "; "
        return sep.join(render_value(item, lang) for item in self.items)

    def __str__(self) -> str:
        return self.render("en")


def _is_message_dict(value: Any) -> bool:
    return isinstance(value, Mapping) and set(value) <= {"key", "params"} and "key" in value


def msg(key: str, **params: Any) -> Message:
    """``Message(key, params)``; the key must be in :data:`MESSAGES`."""
    if key not in MESSAGES:
        raise KeyError(f"no message with the key {key!r} in attnlab.messages.MESSAGES")
    return Message(key, params)


def render(key: str, lang: str = "en", **params: Any) -> str:
    """``msg(key, **params).render(lang)``."""
    return msg(key, **params).render(lang)


def render_value(value: Any, lang: str = "en") -> str:
    """Text in ``lang`` from a :class:`Message`, a message dict (:meth:`Message.as_dict`,
    e.g. read back from a report) or plain text (returned as it is)."""
    if isinstance(value, Message):
        return value.render(lang)
    if _is_message_dict(value):
        return Message.from_dict(value).render(lang)
    return str(value)


def render_error(exc: BaseException, lang: str = "en") -> str:
    """An exception's text in ``lang``: its keyed message where it carries one
    (``exc.message``), else ``str(exc)`` (an error no key was written for yet)."""
    message = getattr(exc, "message", None)
    if isinstance(message, Message):
        return " ".join(message.render(lang).split("\n"))
    return str(exc)
