# ruff: noqa: E501  (a message catalog: a Chinese sentence reads best on one line)
"""``attnlab … --lang zh``: the command line's ``--help`` in Chinese.

The parsers are written once, in English; :func:`localize_parser` replaces each help
text by its Chinese from :data:`HELP_ZH` (keyed by command and option, not by the
English text). Error messages are keyed (:mod:`attnlab.messages`) and rendered in the
language of ``--lang`` by :func:`attnlab.cli.main`.
Names stay as they are: options, Q, K, V, softmax, file names, numbers.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["HELP_ZH", "wants_chinese", "localize_parser"]

#: (command, option) -> Chinese help; option "" = the command's one-line help,
#: "description" = its description, "NAMES" = a positional argument's dest.
HELP_ZH: dict[tuple[str, str], str] = {
    ("", "description"): "从零开始，一步一步地计算自注意力。",
    ("", "--help"): "显示帮助并退出",
    ("", "--lang"): "帮助、错误信息和命令输出的语言",
    # explain
    ("explain", ""): "打印自注意力的每一步（X → Q、K、V → QKᵀ → 缩放 → softmax → ·V）",
    ("explain", "description"): "一步一步地计算自注意力。不加任何选项时：使用原文 000 的例子 "
                                "X = [[1,0,1,0],[0,2,0,2],[1,1,1,1]]，d_k = 3，权重由 --seed 随机生成。",
    ("explain", "--tokens"): "词元标签，用空格分隔，例如 \"小明 去了 学校\"；不给 --x 时，每个词元得到一个固定的玩具嵌入向量",
    ("explain", "--x"): "输入 X（T×E）：直接写 '1,0,1,0; 0,2,0,2' 或 JSON，或一个 .npy/.csv 文件",
    ("explain", "--d-k"): "每个头的维度 d_k（默认 3；--pos rope 时为 4；--split fused 时为 E / 头数）",
    ("explain", "--d-model"): "只给 --tokens、不给 --x 时嵌入向量的宽度（默认 4）",
    ("explain", "--heads"): "注意力头的个数（默认 1）",
    ("explain", "--causal"): "因果掩码：不能看到后面的词元",
    ("explain", "--no-scale"): "去掉除以 √d_k 的缩放，看看原文为什么要缩放",
    ("explain", "--pos"): "位置编码：sinusoidal（正弦）或 learned（可学习），加到 X 上；rope 旋转 Q 和 K；默认 none（不加）",
    ("explain", "--wo"): "用 Wo 投影多头的输出（原文 001 的最后一个线性层）",
    ("explain", "--residual"): "残差连接：x + attention(x)（隐含 --wo）",
    ("explain", "--norm"): "层规范化：post 在残差之后（原文 001 的代码），pre 在注意力之前；隐含 --residual",
    ("explain", "--padding"): "填充掩码，每个词元一个值：1 表示真实词元，0 表示填充；任何词元都不关注填充",
    ("explain", "--split"): "多头的拆分方式：per_head（原文 000：每个头取 Wq 的各自列）或 fused（原文 001：一次投影后 .view(T, H, d_k).transpose）；二者是同一个计算",
    ("explain", "--seed"): "随机权重的种子（默认 0）",
    ("explain", "--init"): "权重初始化方式（默认 normal，与原文的 randn 相同）",
    ("explain", "--lang"): "输出语言",
    ("explain", "--format"): "输出格式（默认 text）",
    ("explain", "--precision"): "打印的小数位数（默认 4）",
    ("explain", "--out"): "同时把 heatmap.png、heatmap.svg、trace.json、trace.md 写到这个文件夹",
    ("inspect", ""): "在一段文本上运行真实模型（all-MiniLM-L6-v2），查看每一个注意力头",
    # verify
    ("verify", ""): "核对一个 Hugging Face 模型的注意力：float64 朴素路径、eager 与 sdpa 逐层对比",
    ("verify", "description"): "在 attnlab 的 float64 朴素路径、eager 和 sdpa（以及 attnlab 的融合路径）上用同一个含填充的批运行一个 Hugging Face 模型文件夹；逐层打印隐藏状态和注意力权重的最大误差、第一个超出 FlashAttention 的 2 倍规则的层，以及差异是舍入误差还是错误。有候选实现超出规则时退出状态为 3。",
    ("verify", "model"): "本地模型文件夹（config.json、权重、分词器文件）",
    ("verify", "--text"): "一段输入文本（可重复，组成一个批；默认两句长度不同的句子，使批含填充）",
    ("verify", "--dtype"): "eager、sdpa 和 attnlab 运行时的浮点类型（默认 float32）",
    ("verify", "--padding-side"): "在哪一侧填充（默认：分词器的设置）",
    ("verify", "--json"): "以 JSON 打印报告",
    ("verify", "--lang"): "输出语言",
    # lens
    ("lens", ""): "哪些注意力头重要：消融、头的重要性与注意力展开（rollout）",
    ("lens", "description"): "用 attnlab 自己的注意力在 TEXT（以及 --pair 给出的另一段文本）上运行预训练 BERT（默认是随包提供的 all-MiniLM-L6-v2）：逐个把每个头、每一层置零，测量与原模型的余弦一致度下降；按 Michel 等人的重要性 |∂cos/∂ξ| 给头排序；把注意力在各层上展开。--study 在随 attnlab 提供的中英文句子对上做完整的研究。",
    ("lens", "text"): "要查看的文本（不与 --study 同用）",
    ("lens", "--pair"): "另一段文本：重要性和消融改为测量 cos(TEXT, OTHER)",
    ("lens", "--study"): "在随包提供的中英文句子对上做完整的研究",
    ("lens", "--how"): "消融方式：置零，或换成每个头的平均输出（默认 zero）",
    ("lens", "--model"): "一个 BERT 文件夹（config.json、model.safetensors、tokenizer.json），代替随包提供的 MiniLM；或任意 Hugging Face 解码器文件夹：通过 attnlab 的钩子点做头消融、重要性、logit lens 和头检测",
    ("lens", "--analysis"): "只用于 Hugging Face 解码器：overview（消融、重要性、logit lens、头检测，默认）、patch（把 --heads 的 z 从 TEXT 的运行修补进 --corrupted 的运行）、patch-sweep（每个头单独修补）、path-patch（--sender 的干净输出只经过 --receivers 到达输出）、dla（每个头对最后一个位置最高词元 logit 的直接贡献）",
    ("lens", "--corrupted"): "被破坏的文本（与 TEXT 词元数相同），用于 patch、patch-sweep 和 path-patch；度量是最后一个位置上 TEXT 的首选下一个词元的对数概率",
    ("lens", "--heads"): "--analysis patch 要修补的头，写成 LAYER.HEAD，从 1 开始编号，例如 1.3,2.1",
    ("lens", "--sender"): "--analysis path-patch 的发送头，写成 LAYER.HEAD，例如 1.2",
    ("lens", "--receivers"): "--analysis path-patch 的接收头（位于发送头之后的层），例如 2.1,2.4",
    ("lens", "--out"): "输出文件夹（默认 attnlab-lens/）",
    ("lens", "--lang"): "输出语言",
    ("train", ""): "在合成任务上训练一个小解码器，观察注意力头如何形成",
    # inspect
    ("inspect", "description"): "用 attnlab 自己的注意力在 TEXT 上运行预训练 BERT（默认是随包提供的 all-MiniLM-L6-v2）；写出热力图、可交互的 HTML 查看器和诊断（熵、稀疏度、[CLS]/[SEP] 汇聚、位置头、头之间的差异）。",
    ("inspect", "text"): "要运行的文本（默认是 Google 2017 年 Transformer 博客和《The Illustrated Transformer》里的例句 “The animal didn't cross the street because it was too tired.”，--lang zh 时是 “天上有月，水中也有月。”）",
    ("inspect", "--layer"): "只看这些层（从 1 开始编号）",
    ("inspect", "--head"): "只看这些头（从 1 开始编号）",
    ("inspect", "--model"): "一个 Hugging Face 模型文件夹（或能连上 Hub 时的模型名），编码器或解码器都可以，使用它自己的分词器；BERT 文件夹用 attnlab 自己的注意力运行，其他模型通过 transformers 在 attnlab 注册的注意力上运行，从其钩子点读取（默认：随包提供的 MiniLM）",
    ("inspect", "--pair"): "第二个句子（句子 B），与 TEXT 作为一个句子对运行（[CLS] A [SEP] B [SEP]，词元类型先 0 后 1）；Hugging Face 模型的页面上会有 A/B 过滤",
    ("inspect", "--generate"): "仅限解码器：在 TEXT 之后贪心生成 N 个词元；页面把提示词与生成的词元区分开，并有一个随 KV 缓存增长的步骤滑块",
    ("inspect", "--ablation"): "另外把每个头单独置零，在页面的头表格中显示输出改变多少（||y_消融 - y|| / ||y||）；每个头多运行一次（通过 transformers 和 attnlab 的钩子点）",
    ("inspect", "--trust-remote-code"): "允许 transformers 运行模型文件夹里附带的代码（默认从不运行）",
    ("inspect", "--out"): "输出文件夹（默认 attnlab-inspect/）",
    ("inspect", "--find"): "列出从词元 A 到词元 B 权重最大的头，例如 “it->animal”（默认文本自带一个）",
    ("inspect", "--max-length"): "最多运行 N 个词元（不超过模型的位置数：MiniLM 是 512；默认用模型配置的长度，MiniLM 是 256）",
    ("inspect", "--lang"): "输出语言",
    ("inspect", "--format"): "打印什么：诊断表格或 JSON（默认表格）",
    # train
    ("train", "description"): "在排序、反转、复制、归纳（随机词元重复一次：[x][x]）或模加法任务上训练一个小因果解码器（由 attnlab.torch 的模块搭成）；写出指标、最后一步的注意力、训练曲线图，以及一个可以拖动训练步数的页面。同一个种子，同样的数字。",
    ("train", "task"): "要训练的任务",
    ("train", "--steps"): "优化步数（默认随任务而定）",
    ("train", "--seed"): "权重、批次和划分的随机种子（默认 0）",
    ("train", "--layers"): "解码器层数（默认 2；modadd 为 1）",
    ("train", "--heads"): "每层的头数（默认 4）",
    ("train", "--d-model"): "模型宽度 E（默认 64）",
    ("train", "--head-dim"): "每个头的维度 D（默认 E/H）",
    ("train", "--no-attn-only"): "只有注意力、没有前馈层（默认：仅 induction 任务如此）",
    ("train", "--pos"): "位置编码（默认可学习位置；induction 用 RoPE）",
    ("train", "--norm"): "LayerNorm 的位置（默认 pre）",
    ("train", "--no-scale"): "训练时不除以 √d_k",
    ("train", "--lr"): "峰值学习率（默认随任务而定）",
    ("train", "--batch"): "每步的样本数（默认随任务而定）",
    ("train", "--warmup"): "线性预热的步数（默认随任务而定）",
    ("train", "--threads"): "torch 的 CPU 线程数（默认用 torch 自己的设置）",
    ("train", "--study"): "不做单次训练，而是检验一个训练论断（scaling：有无 1/√d_k；norm：2/6/12 层、有无预热时 Pre-LN 与 Post-LN；positions：reverse 任务上无位置/正弦/RoPE）",
    ("train", "--seeds"): "--study 中每个设置的种子数（默认 3）",
    ("train", "--out"): "输出文件夹（默认 attnlab-train/）",
    ("train", "--lang"): "输出语言",
    # ring
    ("ring", "description"): "把一条随机序列切分到 W 个进程上，让 K/V 分片沿环传递来计算注意力：在 W 个 gloo 进程上运行（每个进程的峰值内存、每一步的时间、工作量的不均衡、发送的字节数、与单进程结果的误差），或用 --simulate 在 NumPy 中模拟，逐步讲解。",
    ("ring", "--world-size"): "进程数 W（默认 4）",
    ("ring", "--seq"): "序列长度 T，须是 W 的倍数（zigzag 须是 2W 的倍数）",
    ("ring", "--heads"): "查询头数 H（默认 8）",
    ("ring", "--kv-heads"): "键/值头数 Hkv，须整除 H（默认等于 H）",
    ("ring", "--head-dim"): "每个头的维度 D（默认 64）",
    ("ring", "--batch"): "批大小 B（默认 1）",
    ("ring", "--layout"): "位置如何分配给各进程（默认 zigzag）",
    ("ring", "--causal"): "因果注意力",
    ("ring", "--dtype"): "计算用的浮点类型",
    ("ring", "--backward"): "同时运行反向传播（仅多进程时）",
    ("ring", "--repeats"): "预热之后每个进程测量的次数，显示中位数（默认 3）",
    ("ring", "--threads"): "每个进程的 torch 线程数（默认 1）",
    ("ring", "--seed"): "随机输入的种子",
    ("ring", "--timeout"): "超过这么多秒就停止各进程（默认 600）",
    ("ring", "--simulate"): "不启动进程，改用 NumPy 虚拟环运行，逐步打印",
    ("ring", "--lang"): "模拟报告的语言（默认 en）",
    ("ring", "--json"): "以 JSON 打印测量结果",
    ("ring", "--out"): "配合 --simulate：另外把 ring.png（进程 × 步骤）和 ring.txt 写到这里",
    ("ring", ""): "在 W 个本地进程（gloo）上运行环形注意力，或用 NumPy 模拟它",
    # draw
    ("draw", ""): "画出一个概念：多头注意力的数据流、Flash Attention 的分块、KV 缓存、位置编码、稀疏模式",
    ("draw", "description"): "把一个概念画成 PNG：dataflow（多头注意力从 X 到输出的数据流，标出每个张量的形状；以及后置规范化 Post-LN 与前置规范化 Pre-LN 两种残差块）、flash（按键分块，逐步显示运行最大值与运行和）、kvcache（每一步解码后完整缓存与滚动窗口中存放的内容）、positions（正弦位置编码表、RoPE 的角度与相对位置分数）、sparse（滑动窗口、全局词元和 BigBird 块各保留哪些键；Linformer 和 Nyström 的权重与精确权重并排）。",
    ("draw", "names"): "dataflow、flash、kvcache、positions、sparse 中的一个或多个，或 all",
    ("draw", "--lang"): "输出语言",
    ("draw", "--out"): "NAME.png 的文件夹（默认当前文件夹）",
    ("draw", "--tokens"): '仅用于 dataflow：词元标签，以空格分隔，例如 "小明 去了 学校"；标签的个数就是图中形状里的 T（默认 3 个词元）',
    ("draw", "--heads"): "仅用于 dataflow：头数 H（默认 2）",
    ("draw", "--d-model"): "仅用于 dataflow：模型宽度 E，须是 --heads 的倍数（默认 8）",
    # profile
    ("profile", ""): "BERT 中注意力与前馈网络的时间和 FLOPs 占比（MiniLM 与 BERT-base）",
    ("profile", "description"): "逐模块为 BERT 的一次前向计算计时（真实模块中的注意力、前馈网络、LayerNorm 调用和其余部分），并逐部分统计 FLOPs（Q/K/V/输出投影、QKᵀ、softmax、·V、前馈网络、其余），在多个序列长度上进行。",
    ("profile", "--models"): "用逗号分隔，可选 minilm、bert-base、tiny（默认 minilm,bert-base；--quick 时为 tiny）",
    ("profile", "--seq-lens"): "序列长度（默认 128,512,2048；--quick 时为 16,32）",
    ("profile", "--repeats"): "每个 T 计时的次数，报告中位数（默认 3；--quick 时为 1）",
    ("profile", "--threads"): "BLAS 线程数（默认 1）",
    ("profile", "--batch"): "每次前向的序列数（默认 1）",
    ("profile", "--seed"): "词元 id 和随机权重的种子",
    ("profile", "--no-compare"): "不再额外为不带计时钩子的普通前向计时",
    ("profile", "--quick"): "2 层的微型模型，T = 16、32，只跑一次：检查流程是否正常",
    ("profile", "--json"): "以 JSON 而不是表格输出报告",
    ("profile", "--out"): "同时把 profile.json（装有 matplotlib 时还有 profile_shares.png）写到这里",
    ("profile", "--lang"): "表格和图的语言（默认 en）",
    # approx
    ("approx", ""): "测量稀疏注意力和低秩近似相对精确注意力的表现（误差、时间、峰值内存）",
    ("approx", "description"): "近似方法研究：滑动窗口、块稀疏（BigBird）、Linformer、Nyström 和 Performer，各取多个参数值和长度，在接近均匀和尖锐的高斯输入以及真实的 MiniLM Q/K/V 上测量。打印一张表，并指出每种方法在哪些方面不如精确注意力；--out 还会写出 approx.json 和 PNG 图。计时取本机上 N 次交错运行的中位数：请先关闭其他任务。",
    ("approx", "--quick"): "T = 256 和 1024，每个参数取两个值，不做 T = 16,384 的检查（一分钟以内）",
    ("approx", "--out"): "把 approx.json、error_vs_time.png、error_vs_memory.png、time_vs_length.png 和 patterns.png 写到这里",
    ("approx", "--lengths"): "高斯输入的长度（默认 256,1024,4096；quick 时为 256,1024）",
    ("approx", "--minilm-lengths"): "MiniLM 输入的长度，最多 256（默认 128,256）",
    ("approx", "--no-minilm"): "跳过真实的 MiniLM Q/K/V 输入",
    ("approx", "--long"): "因果长序列检查的长度（默认 16384；0 = 跳过；quick 时跳过）",
    ("approx", "--repeats"): "每次测量计时的次数（默认 3）",
    ("approx", "--threads"): "BLAS 线程数，通过 threadpoolctl 设置（默认 1；0 = 不改动）",
    ("approx", "--seed"): "输入和投影的种子",
    ("approx", "--lang"): "表格和图的语言（默认 en）",
    # bench
    ("bench", ""): "注意力基准测试（NumPy 朴素/flash、torch 朴素/SDPA、attnlab.torch）与 KV 缓存解码",
    ("bench", "description"): "测量注意力前向的吞吐量（GFLOP/s）和峰值内存随序列长度的变化、有无 KV 缓存时每个词元的解码延迟，以及生成时间；把表格、results.json 和 PNG 图写到 --out。",
    ("bench", "--out"): "results.json、table.txt 和图的文件夹（默认 attnlab-bench）",
    ("bench", "--quick"): "每一部分都用小规模：一分钟以内完成",
    ("bench", "--sections"): "用逗号分隔：attention、decode、generate（默认全部）",
    ("bench", "--threads"): "NumPy 的 BLAS 和 torch 的线程数，所有测试相同（默认 1）",
    ("bench", "--repeats"): "每个点计时的次数；报告中位数和最小–最大值（默认 5）",
    ("bench", "--min-time"): "每个样本至少持续这么久；更快的调用会循环执行（默认 0.05，--quick 时 0.01）",
    ("bench", "--seed"): "输入和模型的种子（默认 0）",
    ("bench", "--cpu-time"): "与 --roofline 一起使用：按进程的 CPU 时间而不是墙钟时间计时（在与他人共用的机器上，单线程时更稳定）",
    ("bench", "--roofline"): "改为测量本机峰值（sgemm、exp、内存带宽）以及每条注意力路径达到其受限上限的比例（约 30 秒；--quick：极小规模）",
    ("bench", "--lengths"): "序列长度 T = S（默认 256,512,1024,2048,4096；--quick 时 128,256,512）",
    ("bench", "--contenders"): "用逗号分隔，可选 numpy_naive、numpy_flash、torch_naive、torch_sdpa、attnlab_torch（默认全部）",
    ("bench", "--batch"): "B（默认 1）",
    ("bench", "--heads"): "H（默认 8，--quick 时 4）",
    ("bench", "--head-dim"): "D（默认 64）",
    ("bench", "--dtype"): "默认 float32",
    ("bench", "--causal"): "因果注意力（FLOPs 减半）",
    ("bench", "--max-memory"): "分数矩阵所需内存超过此值（GiB）的朴素实现将被跳过（默认 4）",
    ("bench", "--no-memory"): "不测量峰值内存",
    ("bench", "--contexts"): "测量每个词元延迟的上下文长度（默认 128,...,2048；--quick 时 64,...,512）",
    ("bench", "--prompt-len"): "提示的长度（默认 512，--quick 时 64）",
    ("bench", "--new-tokens"): "生成的词元数（默认 512，--quick 时 64）",
    ("bench", "--generate-repeats"): "每种生成方式运行的次数（默认 3，--quick 时 5）：无缓存的 512 + 512 运行需要数分钟",
    ("bench", "--no-plots"): "不写 PNG 文件",
    ("bench", "--no-progress"): "不在 stderr 上显示进度条",
    ("bench", "--lang"): "表格和图的语言（默认 en）",
    ("bench", "group:attention"): "注意力",
    ("bench", "group:decode and generate"): "解码与生成",
}

#: argparse's own words.
_HEADINGS = {"usage: ": "用法：", "positional arguments:": "位置参数：", "options:": "选项：",
             "show this help message and exit": "显示帮助并退出"}

def wants_chinese(argv: Sequence[str]) -> bool:
    """Whether the command line asks for Chinese (``--lang zh`` or ``--lang=zh``)."""
    items = list(argv)
    return "--lang=zh" in items or any(a == "--lang" and b == "zh"
                                       for a, b in zip(items, items[1:], strict=False))


def localize_parser(parser: argparse.ArgumentParser) -> None:
    """Replace the help texts of ``parser`` and its subcommands by their Chinese."""
    _localize(parser, "")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                choice.help = HELP_ZH.get((choice.dest, ""), choice.help)
            for name, sub in action.choices.items():
                _localize(sub, name)


def _localize(parser: argparse.ArgumentParser, command: str) -> None:
    parser.description = HELP_ZH.get((command, "description"), parser.description)
    for group in parser._action_groups:
        if group.title in ("options", "positional arguments"):
            group.title = {"options": "选项", "positional arguments": "位置参数"}[group.title]
        elif group.title is not None:
            group.title = HELP_ZH.get((command, f"group:{group.title}"), group.title)
    for action in parser._actions:
        if action.help == "show this help message and exit":
            action.help = _HEADINGS[action.help]
        key = action.option_strings[-1] if action.option_strings else action.dest
        action.help = HELP_ZH.get((command, key), action.help)
    setattr(parser, "usage_prefix", _HEADINGS["usage: "])  # noqa: B010
