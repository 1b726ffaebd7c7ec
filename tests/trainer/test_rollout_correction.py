"""Rollout correction (config ``rollout_correction``, ``rollout_correction_cap``; trainer/algos/rollout_correction.py).

* The pure functions against hand values: w = π_old / π_sampler = [0.5, 1, 3] with C = 2 gives the TIS weights
  [0.5, 1, 2] and the token mask [kept, kept, dropped] (the band [1/C, C] includes its ends); the sequence masks by
  the product (mis_seq) and the geometric mean (mis_geo) drop different responses; tokens without a sampler log-prob
  (NaN: seed tokens, stale and off-policy rows) have weight 1 and are never dropped; the metrics' sums by hand.
* The denominator rule: masked tokens leave the token-mean denominator, so masking half the tokens gives the mean
  over the kept ones, in the pure reduction and through ``backward_minibatch``.
* It composes with every algorithm: through ``backward_minibatch`` the loss is Σ ℓ·weight / D with weight min(w, C)
  on the sampled tokens and 1 on seed tokens (Thinking Seeds state+action), LUFFY's off-policy traces and M2PO's
  stale rows; the gradient does not depend on the micro-batch size.
* A tiny CPU run logs ``rollout_corr/*`` every step (under ``none`` too); a cap <= 1 is one line, exit 2.
"""

from __future__ import annotations

import json
import math
import os
import sys

import pytest
import torch

from tests.helpers.rollouts import fixed_rollouts
from trainer.algos import (LOSSES, loss_denominator, loss_mask, reduce_loss, rollout_keep, rollout_log_ratio,
                           rollout_mismatch_metrics, rollout_mismatch_sums, rollout_weights)
from trainer.config import load_config, loss_kwargs
from trainer.fsdp import Dist
from trainer.train import main
from trainer.update import (_stack, backward_minibatch, m2po_keep_masks, rollout_correction_metrics,
                            rollout_keep_masks, token_batch)

NAN = math.nan
LOG = math.log


def _tokens(w: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """old_logp, sampler_logp, response_mask [N, T] with π_old / π_sampler = w (NaN: no sampler log-prob, None:
    padding): sampler_logp = -1, old_logp = -1 + log w."""
    T = max(len(r) for r in w)
    resp = torch.tensor([[t < len(r) and r[t] is not None for t in range(T)] for r in w])
    ratio = [[(r[t] if t < len(r) and r[t] is not None else 1.0) for t in range(T)] for r in w]
    sampler = torch.tensor([[NAN if math.isnan(x) else -1.0 for x in r] for r in ratio])
    old = torch.tensor([[-1.0 + (0.0 if math.isnan(x) else LOG(x)) for x in r] for r in ratio])
    return old, sampler, resp


# ---------------------------------------------------------------------------------------------- pure functions
def test_tis_truncates_at_the_cap_and_mis_token_keeps_the_closed_band():
    old, sampler, resp = _tokens([[0.5, 1.0, 3.0, 2.0, 0.4]])
    w = rollout_weights(old, sampler, resp, mode="tis", cap=2.0)
    assert w.tolist()[0] == pytest.approx([0.5, 1.0, 2.0, 2.0, 0.4], abs=1e-6)
    assert rollout_keep(old, sampler, resp, mode="mis_token", cap=2.0).tolist() == [[True, True, False, True, False]]
    for mode in ("none", "mis_token", "mis_seq", "mis_geo"):   # only tis reweights
        assert rollout_weights(old, sampler, resp, mode=mode, cap=2.0).tolist() == [[1.0] * 5]
    for mode in ("none", "tis"):   # only mis_* masks
        assert rollout_keep(old, sampler, resp, mode=mode, cap=2.0).all()


def test_tokens_without_a_sampler_logprob_have_weight_one_and_are_never_masked():
    # a seeded row: 2 seed tokens (NaN) with a wild "ratio" that must not count, then 2 sampled tokens; padding last
    old, sampler, resp = _tokens([[NAN, NAN, 3.0, 1.0], [NAN, NAN, None, None]])
    old[0, :2] = 50.0   # would be w = e^51 if it were read
    log_w, sampled = rollout_log_ratio(old, sampler, resp)
    assert sampled.tolist() == [[False, False, True, True], [False, False, False, False]]
    assert log_w[0].tolist() == pytest.approx([0.0, 0.0, LOG(3.0), 0.0], abs=1e-6)
    assert rollout_weights(old, sampler, resp, mode="tis", cap=2.0).tolist()[0] == pytest.approx([1, 1, 2, 1])
    # sampled w = [3, 1]: mis_token drops the 3; mis_seq the response (product 3); mis_geo keeps it (sqrt(3) < 2);
    # the seed tokens and the row with nothing sampled stay whatever the mode
    for mode, row0 in [("mis_token", [True, True, False, True]), ("mis_seq", [True, True, False, False]),
                       ("mis_geo", [True, True, True, True])]:
        keep = rollout_keep(old, sampler, resp, mode=mode, cap=2.0)
        assert keep.tolist() == [row0, [True] * 4], mode


def test_sequence_masks_by_the_product_and_by_the_geometric_mean():
    rows = [[0.5, 1.0, 3.0],        # product 1.5, geometric 1.145: kept by both
            [3.0, 3.0],             # product 9, geometric 3: dropped by both
            [1.2] * 5,              # product 2.49 > 2: dropped by mis_seq; geometric 1.2: kept by mis_geo
            [0.4, 0.4, None],       # product 0.16 < 1/2: dropped by both (the lower bound; padding last)
            [NAN, 3.0, 1.0]]        # a seed token, then product 3: the sampled tokens dropped, the seed kept
    old, sampler, resp = _tokens(rows)
    seq = rollout_keep(old, sampler, resp, mode="mis_seq", cap=2.0)
    geo = rollout_keep(old, sampler, resp, mode="mis_geo", cap=2.0)
    sampled = resp & ~sampler.isnan()
    # per response: are its sampled tokens kept (all of a response's sampled tokens share one verdict)
    for keep in (seq, geo):
        for i in range(len(rows)):
            assert len(set(keep[i][sampled[i]].tolist())) == 1
    assert [bool(seq[i][sampled[i]][0]) for i in range(5)] == [True, False, False, False, False]
    assert [bool(geo[i][sampled[i]][0]) for i in range(5)] == [True, False, True, False, True]   # sqrt(3) < 2
    assert seq[4, 0] and geo[4, 0]   # the seed token is never dropped
    # mis_geo's typical band is tight (verl: 1.001): 1.2 per token is then far outside it
    assert not rollout_keep(old, sampler, resp, mode="mis_geo", cap=1.001)[2].any()


def test_the_metrics_sums_by_hand():
    # sampled w: [0.5, 1, 3] and [2] (after a seed token); C = 2
    old, sampler, resp = _tokens([[0.5, 1.0, 3.0], [NAN, 2.0]])
    k3 = [w - LOG(w) - 1 for w in (0.5, 1.0, 3.0, 2.0)]   # 0.19315, 0, 0.90139, 0.30685
    log_ppl = (-(LOG(0.5) + LOG(1.0) + LOG(3.0)) / 3 - LOG(2.0)) / 2   # mean over responses: -0.41415
    for mode, extra in [("none", {}), ("tis", {"rollout_corr/clipped_share": 0.25}),
                        ("mis_token", {"rollout_corr/masked_share": 0.25}),   # w = 3 leaves [1/2, 2]
                        ("mis_seq", {"rollout_corr/masked_share": 0.0})]:     # products 1.5 and 2: both kept
        sums = rollout_mismatch_sums(old, sampler, resp, mode=mode, cap=2.0)
        m = rollout_mismatch_metrics(sums, mode=mode)
        want = {"rollout_corr/weight_mean": 6.5 / 4, "rollout_corr/k3_kl": sum(k3) / 4,
                "rollout_corr/log_ppl_ratio": log_ppl, "rollout_corr/tokens": 4, **extra}
        assert m == pytest.approx(want, abs=1e-6), mode
    assert sum(k3) / 4 == pytest.approx(0.350347, abs=1e-6) and log_ppl == pytest.approx(-0.414151, abs=1e-6)
    # sums add over micro-batches and ranks: the two rows apart give the same metrics
    parts = [rollout_mismatch_sums(old[i:i + 1], sampler[i:i + 1], resp[i:i + 1], mode="tis", cap=2.0) for i in (0, 1)]
    joined = {k: parts[0][k] + parts[1][k] for k in parts[0]}
    assert rollout_mismatch_metrics(joined, mode="tis") == pytest.approx(
        rollout_mismatch_metrics(rollout_mismatch_sums(old, sampler, resp, mode="tis", cap=2.0), mode="tis"))
    # nothing sampled (an all-stale M2PO batch): no metrics
    assert rollout_mismatch_metrics(rollout_mismatch_sums(old, torch.full_like(sampler, NAN), resp, mode="tis",
                                                          cap=2.0), mode="tis") == {}


def test_the_pure_functions_refuse_a_cap_that_leaves_nothing():
    old, sampler, resp = _tokens([[1.0]])
    for mode in ("tis", "mis_token", "mis_seq"):
        with pytest.raises(AssertionError, match="must be > 1"):
            rollout_keep(old, sampler, resp, mode=mode, cap=1.0)
    assert rollout_keep(old, sampler, resp, mode="none", cap=0.0).all()   # the cap means nothing without a mode


def test_masked_tokens_leave_the_token_mean_denominator():
    # loss 1, 2, 3, 4 on four response tokens, masked IS drops the 2nd and 4th: the loss is the kept tokens' mean
    loss_mat = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    resp = torch.ones(1, 4, dtype=torch.bool)
    keep = torch.tensor([[True, False, True, False]])
    m = loss_mask(resp, torch.zeros(1, dtype=torch.long), seed_loss="state+action", rollout_keep=keep)
    D = loss_denominator(m, mode="token-mean")
    assert D == 2.0
    assert float(reduce_loss(loss_mat, m, mode="token-mean", denominator=D)) == pytest.approx(2.0)   # (1 + 3) / 2
    # seq-mean keeps counting responses: a fully dropped response adds 0 over N = 2
    two = torch.tensor([[1.0, 2.0], [5.0, 7.0]])
    m2 = loss_mask(torch.ones(2, 2, dtype=torch.bool), torch.zeros(2, dtype=torch.long), seed_loss="state",
                   rollout_keep=torch.tensor([[True, True], [False, False]]))
    assert float(reduce_loss(two, m2, mode="seq-mean-token-mean",
                             denominator=loss_denominator(m2, mode="seq-mean-token-mean"))) == pytest.approx(0.75)


# ---------------------------------------------------------------------------------------------- in the trainer
def _setup(algorithm: str, micro_batch_size: int = 64, d: Dist | None = None, **over):
    from inference.tiny import build_model, build_tokenizer
    from trainer.fsdp import shard_model
    from trainer.policy import score
    d = d or Dist()
    tok = build_tokenizer()
    cfg = load_config(None, [f"algorithm={algorithm}", f"micro_batch_size={micro_batch_size}", "train_forward=model",
                             *[f"{k}={v}" for k, v in over.items()]])
    rows = fixed_rollouts(tok, algorithm=algorithm)
    for i, r in enumerate(rows):
        r.uid = i
    model = build_model("1m", tok, seed=3)
    if d.enabled:
        model = shard_model(model, d, param_dtype=torch.float32)
    logp, _ = score(model, [r.prompt_ids for r in rows], [r.response_ids for r in rows], pad_id=tok.pad_token_id,
                    micro_batch_size=64, d=d)
    old = {r.uid: lp.tolist() for r, lp in zip(rows, logp)}
    return tok, cfg, rows, model, old


def _sample(rows, old, shift) -> None:
    """sampler_logp = old - shift(row, t) on the tokens the engine sampled (w = exp(shift)); NaN on seed tokens;
    None on rows the engine did not sample now (LUFFY's traces, M2PO's stale rows)."""
    for r in rows:
        if r.variant in ("luffy_off", "stale"):
            r.sampler_logp = None
            continue
        r.sampler_logp = [NAN if t < r.seed_len else lp - shift(r, t) for t, lp in enumerate(old[r.uid])]


def _hand_loss(tok, cfg, rows, old, weight_of, keep_of=None):
    """Σ ℓ·weight / D from the table entry, the step's denominator over the loss mask (keep_of: masked IS's kept
    tokens, by hand), in one forward of a fresh copy of the same model."""
    from inference.tiny import build_model
    from trainer.policy import response_logprobs
    model = build_model("1m", tok, seed=3)
    with torch.no_grad():
        logp, _, resp = response_logprobs(model, [r.prompt_ids for r in rows], [r.response_ids for r in rows],
                                          pad_id=tok.pad_token_id, device="cpu", forward="model")
    R = logp.shape[1]
    old_t = _stack(rows, [old[r.uid] for r in rows], R, 0.0)
    keep_t = None
    if cfg.algorithm == "m2po":
        keep = m2po_keep_masks(cfg, rows, old)
        keep_t = _stack(rows, [keep[r.uid] for r in rows], R, 0.0).bool()
    loss_mat, _ = LOSSES[cfg.algorithm](token_batch(rows, logp, old_t, resp, keep_t), **loss_kwargs(cfg))
    w = torch.tensor([[weight_of(r, t) if t < len(r.response_ids) else 1.0 for t in range(R)] for r in rows])
    k = None if keep_of is None else torch.tensor([[t < len(r.response_ids) and keep_of(r, t) for t in range(R)]
                                                  for r in rows])
    mask = loss_mask(resp, torch.tensor([r.seed_len for r in rows]), seed_loss=cfg.seed_loss, rollout_keep=k)
    D = loss_denominator(mask, mode=cfg.loss_agg, max_len=cfg.max_response_tokens)
    return float(reduce_loss(loss_mat * w, mask, mode=cfg.loss_agg, denominator=D)), int(mask.sum())


def _sampled(r, t) -> bool:
    return r.variant not in ("luffy_off", "stale") and t >= r.seed_len


@pytest.mark.parametrize("algorithm", ["dapo", "seeds", "luffy", "m2po"])
def test_tis_weights_the_sampled_tokens_only_for_every_algorithm(algorithm):
    # every sampled token has w = 3 -> weight min(3, 2) = 2; seed tokens (state+action), off-policy and stale rows 1
    tok, cfg, rows, model, old = _setup(algorithm, rollout_correction="tis")
    _sample(rows, old, lambda r, t: LOG(3.0))
    total, records = backward_minibatch(model, cfg, rows, Dist(), pad_id=tok.pad_token_id, old=old,
                                        keep=m2po_keep_masks(cfg, rows, old))
    want, n = _hand_loss(tok, cfg, rows, old, lambda r, t: 2.0 if _sampled(r, t) else 1.0)
    assert n == sum(len(r.response_ids) for r in rows)   # tis drops nothing
    assert total == pytest.approx(want, abs=1e-6)
    if algorithm == "seeds":   # the seeds really are there and keep weight 1: the loss differs from all-weights-2
        assert sum(r.seed_len for r in rows) > 0
        assert total != pytest.approx(_hand_loss(tok, cfg, rows, old, lambda r, t: 2.0)[0], abs=1e-4)


@pytest.mark.parametrize("algorithm, mode", [("dapo", "mis_token"), ("dapo", "mis_seq"), ("seeds", "mis_seq"),
                                             ("luffy", "mis_token")])
def test_masked_tokens_leave_the_loss_and_its_denominator_in_the_trainer(algorithm, mode):
    # sample 0 of every group: w = 3 on its first sampled token -> mis_token drops that token, mis_seq (product 3)
    # every sampled token of the response; seed tokens stay (state+action), LUFFY's trace is never touched
    tok, cfg, rows, model, old = _setup(algorithm, rollout_correction=mode)
    first = {r.uid: r.seed_len for r in rows}
    _sample(rows, old, lambda r, t: LOG(3.0) if r.sample_idx == 0 and t == first[r.uid] else 0.0)
    if mode == "mis_token":
        drop = lambda r, t: r.sample_idx == 0 and t == first[r.uid] and _sampled(r, t)   # noqa: E731
    else:
        drop = lambda r, t: r.sample_idx == 0 and _sampled(r, t)   # noqa: E731
    kept = rollout_keep_masks(cfg, rows, old)
    assert [not k for r in rows for k in kept[r.uid]] == [drop(r, t) for r in rows for t in range(len(r.response_ids))]
    total, records = backward_minibatch(model, cfg, rows, Dist(), pad_id=tok.pad_token_id, old=old)
    want, n = _hand_loss(tok, cfg, rows, old, lambda r, t: 1.0, keep_of=lambda r, t: not drop(r, t))
    n_drop = sum(drop(r, t) for r in rows for t in range(len(r.response_ids)))
    assert n_drop > 0 and n == sum(len(r.response_ids) for r in rows) - n_drop   # the denominator: kept tokens only
    assert total == pytest.approx(want, abs=1e-6)
    assert sum(sum(rec.loss_mask) for rec in records.values()) == n   # the records' loss mask says the same
    with pytest.raises(AssertionError, match="needs old="):
        backward_minibatch(model, cfg, rows, Dist(), pad_id=tok.pad_token_id)


def _mixed_step(algorithm: str, mode: str, micro_batch_size: int, d: Dist | None = None):
    """One mini-batch with w in {3, 1, 1/2.5} over the sampled tokens: the summed loss, the rollout_corr/* metrics
    and the full gradient."""
    d = d or Dist()
    tok, cfg, rows, model, old = _setup(algorithm, micro_batch_size, d, rollout_correction=mode)
    _sample(rows, old, lambda r, t: [LOG(3.0), 0.0, -LOG(2.5)][(r.uid + t) % 3])
    total, records = backward_minibatch(model, cfg, rows, d, pad_id=tok.pad_token_id, old=old)
    metrics = rollout_correction_metrics(cfg, rows, records, d)
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
             for n, p in model.named_parameters() if p.grad is not None}
    return total, metrics, grads


@pytest.mark.parametrize("algorithm, mode", [("dapo", "tis"), ("seeds", "mis_seq"), ("dapo", "mis_token")])
def test_the_gradient_does_not_depend_on_the_micro_batch_size(algorithm, mode):
    ref_loss, ref_metrics, ref = _mixed_step(algorithm, mode, 12)
    share = ref_metrics["rollout_corr/clipped_share" if mode == "tis" else "rollout_corr/masked_share"]
    assert 0 < share < 1   # the batch really has clipped or masked tokens, and kept ones
    for mbs in (1, 5):
        loss, metrics, g = _mixed_step(algorithm, mode, mbs)
        assert loss == pytest.approx(ref_loss, abs=1e-6)
        assert metrics == pytest.approx(ref_metrics, abs=1e-9)
        assert max(float((ref[k] - g[k]).abs().max()) for k in ref) <= 1e-6


@pytest.mark.slow
def test_two_ranks_give_the_one_rank_gradient_and_metrics(tmp_path):
    # FSDP2 on gloo: each rank trains a shard of the rows, the mask and the denominator cover all of them, and the
    # metrics' sums add over ranks (Thinking Seeds state+action, sequence-level masked IS)
    import subprocess
    from pathlib import Path

    from tests.helpers.processes import free_port
    _, one_metrics, one = _mixed_step("seeds", "mis_seq", 2)
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=f"{repo}", OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                          str(free_port()), __file__, str(tmp_path / "two.pt")],
                         cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    two_metrics, two = torch.load(tmp_path / "two.pt")
    assert two_metrics == pytest.approx(one_metrics, abs=1e-9) and one_metrics["rollout_corr/masked_share"] > 0
    assert max(float((one[k] - two[k]).abs().max()) for k in one) <= 1e-5


def _two_rank_worker(out: str) -> None:
    from trainer.fsdp import init_distributed, shutdown
    d = init_distributed()
    _, metrics, grads = _mixed_step("seeds", "mis_seq", 2, d)
    if d.is_main:
        torch.save((metrics, grads), out)
    shutdown(d)


# ---------------------------------------------------------------------------------------------- launches
def _tiny(out, **extra) -> list[str]:
    base = {"output_dir": str(out), "run_name": "run", "model": "tiny:1m", "task": "addition",
            "task_kwargs": json.dumps({"min_digits": 1, "max_digits": 1}), "num_train_examples": 64,
            "prompts_per_step": 4, "samples_per_prompt": 2, "max_response_tokens": 6, "lr": 1e-4,
            "total_steps": 2, "save_every": 0, "progress": False, "log_rollouts": False, "dynamic_sampling": False}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


@pytest.mark.parametrize("mode, share", [("none", None), ("tis", "clipped_share"), ("mis_seq", "masked_share")])
def test_a_tiny_run_logs_the_mismatch_every_step(tmp_path, capsys, mode, share):
    assert main(_tiny(tmp_path, rollout_correction=mode)) == 0, capsys.readouterr().err
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1]
    for m in lines:
        # the HF engine samples from the trained module itself: w is 1 up to float noise, nothing clipped or masked
        assert m["rollout_corr/tokens"] == m["rollout/logp_tokens"] > 0
        assert m["rollout_corr/weight_mean"] == pytest.approx(1.0, abs=1e-5)
        assert 0.0 <= m["rollout_corr/k3_kl"] < 1e-8
        assert abs(m["rollout_corr/log_ppl_ratio"]) < 1e-5
        shares = {k for k in m if k.startswith("rollout_corr/") and k.endswith("_share")}
        assert shares == ({f"rollout_corr/{share}"} if share else set())
        if share:
            assert m[f"rollout_corr/{share}"] == 0.0


@pytest.mark.parametrize("over, expected", [
    ({"rollout_correction": "mis_token", "rollout_correction_cap": 1.0}, "rollout_correction_cap must be > 1"),
    ({"rollout_correction": "tis", "rollout_correction_cap": 0.5}, "rollout_correction_cap must be > 1"),
    ({"rollout_correction": "mis"}, "rollout_correction"),
])
def test_a_bad_correction_is_one_line_exit_2(tmp_path, capsys, over, expected):
    assert main(_tiny(tmp_path / "runs", **over)) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error") and expected in lines[0], lines
    assert not (tmp_path / "runs").exists()


if __name__ == "__main__":   # the torchrun worker of test_two_ranks_give_the_one_rank_gradient_and_metrics
    _two_rank_worker(sys.argv[1])
