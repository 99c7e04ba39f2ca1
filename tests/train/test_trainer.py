"""The trainer: same seed, same numbers; what it records has the shapes it says; the
model's options (no scaling, ablation) compute what they claim, checked against a
computation written out here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab.errors import AttnlabError
from attnlab.train import Decoder, DecoderConfig, TrainConfig, evaluate, snapshot_steps, train
from attnlab.train.tasks import make_task

TINY = {"d_model": 16, "num_heads": 2, "num_layers": 2}


def _run(seed=0, task_name="sort", **model):
    task = make_task(task_name, **({"length": 4, "digits": 5, "heldout": 50}
                                   if task_name == "sort" else {"period": 4, "vocab": 6,
                                                                "heldout": 40}))
    config = DecoderConfig(task.vocab_size, task.seq_len, **{**TINY, **model})
    return train(task, config, TrainConfig(steps=12, batch_size=8, seed=seed, snapshots=4,
                                           snapshot_batch=10, warmup=3))


def test_same_seed_same_numbers():
    a, b = _run(seed=3), _run(seed=3)
    assert np.array_equal(a.losses, b.losses)  # bit for bit: one process, one thread count
    assert np.array_equal(a.snapshots, b.snapshots)
    ma, mb = a.metrics(), b.metrics()
    ma.pop("seconds"), mb.pop("seconds")
    assert ma == mb
    c = _run(seed=4)
    assert not np.array_equal(a.losses, c.losses)


def test_what_a_run_records():
    steps: list[int] = []
    task = make_task("induction", period=4, vocab=6, heldout=40)
    config = DecoderConfig(task.vocab_size, task.seq_len, attn_only=True, pos="rope", **TINY)
    result = train(task, config, TrainConfig(steps=10, batch_size=4, snapshots=3,
                                             snapshot_batch=5),
                   on_step=lambda step, total, loss: steps.append(step))
    assert steps == list(range(1, 11)) and len(result.losses) == 10
    assert result.snapshot_steps == [0, 5, 10] == snapshot_steps(10, 3)
    assert result.snapshots.shape == (3, 2, 2, 8, 8) and result.snapshots.dtype == np.float32
    np.testing.assert_allclose(result.snapshots.sum(-1), 1.0, atol=1e-5)  # float32 rows
    assert np.array_equal(result.snapshot_tokens, task.heldout_inputs[0])
    assert set(result.head_history) == {"previous_token", "duplicate_token", "induction"}
    assert all(h.shape == (3, 2, 2) for h in result.head_history.values())
    metrics = result.metrics()
    assert metrics["period"] == 4 and "heldout_accuracy" not in metrics
    assert metrics["head_score_options"] == {"exclude_bos": True, "exclude_current_token": False}
    assert metrics["first_half_loss"] is not None and metrics["second_half_loss"] is not None
    assert len(metrics["history"]["head_scores"]["induction"]) == 3


def test_sort_metrics_have_the_heldout_accuracy():
    metrics = _run().metrics()
    assert 0.0 <= metrics["heldout_accuracy"] <= 1.0 and metrics["heldout_examples"] == 50


def _manual_layer0_weights(model, ids, scale):
    """Layer 0's attention written out: LN1(embed) -> q, k per head -> causal softmax."""
    block = model.blocks[0]
    with torch.no_grad():
        x = block.norm1(model.embed(ids))  # (B, T, E)
        B, T, _ = x.shape
        # the raw projections (F.linear, not the modules: q_proj carries the √D hook)
        q_lin, k_lin = block.attn.q_proj, block.attn.k_proj
        q = F.linear(x, q_lin.weight, q_lin.bias).view(B, T, 2, -1).transpose(1, 2)  # (B, H, T, D)
        k = F.linear(x, k_lin.weight, k_lin.bias).view(B, T, 2, -1).transpose(1, 2)
        if block.attn.rope:
            raise AssertionError("no RoPE here")
        scores = (q @ k.transpose(-1, -2)) * scale  # (B, H, T, T)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        return torch.softmax(scores.masked_fill(~causal, -math.inf), dim=-1)


@pytest.mark.parametrize("scale", [True, False])
def test_scaling_on_and_off(scale):
    config = DecoderConfig(7, 6, d_model=32, num_heads=2, attn_only=True, pos="none",
                         scale=scale)  # D = 16: the √D factors are powers of two
    model = Decoder(config, seed=1).eval()
    ids = torch.randint(0, 7, (3, 6), generator=torch.Generator().manual_seed(0))
    _, weights = model(ids, return_weights=True)
    expected = _manual_layer0_weights(model, ids, 0.25 if scale else 1.0)
    # float32 softmax of the same products in another op order: a few ulps of 1.
    torch.testing.assert_close(weights[:, 0], expected, atol=2e-6, rtol=0)


def test_zero_ablation_is_removing_the_heads_columns_of_the_output_projection():
    config = DecoderConfig(7, 6, **TINY)
    model = Decoder(config, seed=2).eval()
    ids = torch.randint(0, 7, (3, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), model.ablate([(1, 0)]):
        ablated = model(ids)
    plain = model(ids)
    edited = Decoder(config, seed=2).eval()
    with torch.no_grad():
        edited.blocks[1].attn.out_proj.weight[:, :8] = 0.0  # head 0's Dv = 8 input columns
        expected = edited(ids)
    assert torch.equal(ablated, expected)  # the same products, with zeros: exact
    assert not torch.allclose(ablated, plain)
    assert torch.equal(model(ids), plain)  # the ablation ends with the block


def test_mean_ablation_is_a_constant_head_output():
    config = DecoderConfig(7, 6, **TINY)
    model = Decoder(config, seed=2).eval()
    ids = torch.randint(0, 7, (4, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        recorded = {}
        hook = model.blocks[0].attn.out_proj.register_forward_pre_hook(
            lambda m, inp: recorded.setdefault("merged", inp[0].clone()))
        model(ids)
        hook.remove()
        mean = recorded["merged"][..., 8:16].reshape(-1, 8).mean(0)  # head 1 of layer 0
        with model.ablate([(0, 1)], "mean", reference=ids):
            ablated = model(ids)
        edited = Decoder(config, seed=2).eval()
        out_proj = edited.blocks[0].attn.out_proj
        out_proj.bias += out_proj.weight[:, 8:16] @ mean
        out_proj.weight[:, 8:16] = 0.0
        expected = edited(ids)
    # the mean's product moved into the bias: float32 rounding of one extra sum
    torch.testing.assert_close(ablated, expected, atol=1e-5, rtol=1e-5)


def test_evaluate_counts_exact_matches():
    task = make_task("copy", length=3, digits=4, heldout=10)
    model = Decoder(DecoderConfig(task.vocab_size, task.seq_len, **TINY)).eval()
    result = evaluate(model, task)
    with torch.no_grad():
        logits = model(torch.from_numpy(task.heldout_inputs))
    guess = logits.argmax(-1).numpy()
    scored = task.heldout_targets >= 0
    expected = np.mean([(g[s] == t[s]).all() for g, t, s in
                        zip(guess, task.heldout_targets, scored, strict=True)])
    assert result.accuracy == expected
    nll = torch.nn.functional.cross_entropy(
        logits[torch.from_numpy(scored)], torch.from_numpy(task.heldout_targets[scored]))
    assert result.loss == pytest.approx(float(nll), rel=1e-6)  # float64 vs float32 sums


def test_bad_settings_are_named():
    with pytest.raises(AttnlabError, match="pos: expected one of"):
        DecoderConfig(5, 5, pos="alibi")
    with pytest.raises(AttnlabError, match="norm: expected"):
        DecoderConfig(5, 5, norm="sandwich")
    with pytest.raises(AttnlabError, match="lr: expected a finite number > 0"):
        TrainConfig(lr=0)
    with pytest.raises(AttnlabError, match="steps"):
        TrainConfig(steps=0)
    task = make_task("sort", length=3, digits=4, heldout=10)
    with pytest.raises(AttnlabError, match="model_config: expected vocab_size = 4"):
        train(task, DecoderConfig(9, 9))
    model = Decoder(DecoderConfig(4, 5, **TINY))
    with pytest.raises(AttnlabError, match="heads: expected"):
        with model.ablate([(2, 0)]):
            pass
    with pytest.raises(AttnlabError, match="reference"):
        with model.ablate([(0, 0)], "mean"):
            pass


def test_ablated_heads_must_be_pairs_of_ints():
    # evaluate(ablate=[(0,)]) ended in Python's "not enough values to unpack"; (True,
    # False) was taken as head (1, 0) and 1.7 truncated.
    model = Decoder(DecoderConfig(7, 6, **TINY), seed=0)
    task = make_task("sort", length=3, digits=7, heldout=20)
    for bad in ([(0,)], [(True, False)], [(0, 1.7)], [0]):
        with pytest.raises(AttnlabError, match=r"^ablate: expected \(layer, head\) pairs of "
                                               r"ints, got "):
            evaluate(model, task, ablate=bad)
    with pytest.raises(AttnlabError, match=r"^heads: expected \(layer, head\) pairs of ints"):
        with model.ablate([(0,)]):
            pass
    assert math.isfinite(evaluate(model, task, ablate=[(np.int64(1), 0)]).loss)


def test_a_diverging_run_reports_where_instead_of_raising():
    """lr = 1e6 blows the weights up within a few steps: train() returns, saying at which
    step (diverged_at) and the last finite loss, and metrics() is valid JSON."""
    import json

    task = make_task("sort", length=4, digits=5, heldout=50)
    config = DecoderConfig(task.vocab_size, task.seq_len, **TINY)
    result = train(task, config, TrainConfig(steps=30, batch_size=8, lr=1e6, snapshots=31,
                                             snapshot_batch=10))
    assert result.diverged_at is not None and 1 <= result.diverged_at < 30
    assert len(result.losses) == result.diverged_at
    metrics = json.loads(json.dumps(result.metrics(), allow_nan=False))
    assert metrics["diverged_at"] == result.diverged_at
    step, loss = metrics["last_finite_step"], metrics["last_finite_loss"]
    assert step is not None and math.isfinite(loss) and loss == result.losses[step - 1]
    assert all(np.isfinite(result.losses[:step]))
    assert result.snapshot_steps[-1] < result.diverged_at  # only finite snapshots kept


def test_former_names_of_the_config_still_work_and_warn():
    import attnlab.train

    with pytest.warns(DeprecationWarning, match="DecoderConfig"):
        old_class = attnlab.train.ModelConfig
    assert old_class is DecoderConfig
    with pytest.warns(DeprecationWarning, match="say pos="):
        config = DecoderConfig(7, 6, positions="rope")
    assert config.pos == "rope" and "positions" not in config.to_dict()
