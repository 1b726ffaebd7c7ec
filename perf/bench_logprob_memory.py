"""Peak memory of the trainer's log-prob forward for one long row: full-vocabulary logits vs the chunked LM head.

One row of 8,192 response tokens (a 16-token prompt) through a Qwen2-architecture model with Qwen2.5-Math-7B's
vocabulary (152,064) but one small layer (hidden 64), randomly initialised from a config, so the LM
head's logits are everything there is to measure. Forward and backward of a loss over log-probs and entropies,
``trainer.policy.response_logprobs`` with the padded layout (what FSDP2 runs), temperature 1.0:

* **full logits** (the computation before issue 13): the model returns the [T, V] logits, they are copied to
  float32 (a no-op for a float32 model) and reduced in row chunks by ``trainer.algos.logprobs_and_entropy``;
  backward writes the [T, V] gradient of those logits.
* **chunked head** (now): ``LOGIT_CHUNK_TOKENS`` = 1024 positions at a time through the head, log-softmax and
  entropy in float32, each chunk recomputed in backward.

Each side runs in a fresh interpreter; on the CPU (float32, the CPU's compute dtype) the number is the growth of
peak resident memory over the model and inputs (``VmHWM``, reset before the row: ``common.PeakRSS``), on CUDA (bf16 compute, fp32 masters)
``torch.cuda.max_memory_allocated``. A dispatch-mode tally also records the largest float32 tensor any op produced.
Target: the chunked head's peak is at most 0.35 of the full logits' at T = 8192 (a constant ~6 float32 [1024, V]
buffers of one chunk's log-softmax, entropy and their backward, against the row's [T, V] logits, their gradient
and the same chunk buffers; the full path grows with T, the chunked one does not). Each side takes ~2.5 minutes
on 2 CPU cores (the CPU allocator maps and faults in every multi-GB buffer afresh).
"""

from __future__ import annotations

from perf.common import BenchResult, Check, Side, call_in_subprocess, ratio

NAME = "logprob_memory"
TARGET = 0.35


def params_for(ctx) -> dict:
    if ctx.quick:
        return {"tokens": 2048, "vocab": 16_000, "hidden": 32}
    return {"tokens": 8192, "vocab": 152_064, "hidden": 64}


def row_run(*, path: str, tokens: int, vocab: int, hidden: int) -> dict:
    """One forward + backward of ``path`` (``full`` | ``chunked``) on one row; peak memory growth in GB."""
    import time

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from perf.common import PeakRSS
    from trainer.algos import logprobs_and_entropy
    from trainer.fsdp import Dist, shard_model
    from trainer.policy import pack, response_logprobs

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    compute = torch.bfloat16 if cuda else torch.float32
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False, pad_token_id=0)
    torch.manual_seed(0)
    model = shard_model(Qwen2ForCausalLM(cfg).to(device), Dist(device=torch.device(device)), param_dtype=compute)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, vocab, (16,), generator=g).tolist()]
    responses = [torch.randint(1, vocab, (tokens,), generator=g).tolist()]

    class Tally(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                    Tally.largest = max(Tally.largest, t.numel())
            return out

    def full():   # the log-prob forward as it was: all response logits, a float32 copy, row-chunked reduction
        ids, attn, pos, resp_ids, mask = pack(prompts, responses, pad_id=0, device=device)
        R = resp_ids.shape[1]
        keep = torch.arange(ids.shape[1] - R - 1, ids.shape[1] - 1, device=device)
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos, logits_to_keep=keep).logits.float()
        lp, en = logprobs_and_entropy(logits, resp_ids)
        return lp, en, mask

    def chunked():
        return response_logprobs(model, prompts, responses, pad_id=0, device=device, forward="model")

    fn = {"full": full, "chunked": chunked}[path]
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    with PeakRSS() as rss, Tally():
        lp, en, mask = fn()
        ((lp - 0.01 * en) * mask).sum().backward()
    if cuda:
        torch.cuda.synchronize()
        peak = (torch.cuda.max_memory_allocated() - base) / 1e9
    else:
        peak = rss.peak / 1e9
    return {"peak_gb": peak, "seconds": time.perf_counter() - t0, "largest_fp32_elements": Tally.largest,
            "device": device}


def run(ctx) -> BenchResult:
    p = params_for(ctx)
    res = BenchResult(NAME, "peak memory of one long row's log-prob forward + backward: full-vocabulary logits "
                      "vs the chunked LM head", params=p)
    outs = {}
    for path in ("full", "chunked"):   # one run each: memory does not move with the load
        outs[path] = call_in_subprocess("perf.bench_logprob_memory:row_run", {"path": path, **p},
                                        threads=ctx.threads, timeout=1200)
        ctx.log(f"  logprob_memory {path}: {outs[path]['peak_gb']:.2f} GB, {outs[path]['seconds']:.1f} s")
    full, chunked = outs["full"], outs["chunked"]
    res.sides += [Side("full logits peak", "GB", [full["peak_gb"]]), Side("chunked head peak", "GB", [chunked["peak_gb"]]),
                  Side("full logits time", "s", [full["seconds"]]), Side("chunked head time", "s", [chunked["seconds"]])]
    res.info.update({"device": full["device"], "T_x_V": p["tokens"] * p["vocab"],
                     "full_largest_fp32_elements": full["largest_fp32_elements"],
                     "chunked_largest_fp32_elements": chunked["largest_fp32_elements"],
                     "chunked_over_full_time": ratio(chunked["seconds"], full["seconds"])})
    res.checks.append(Check("chunked / full-logits peak memory", ratio(chunked["peak_gb"], full["peak_gb"]), "<=",
                            TARGET, "one run each, fresh interpreters"))
    return res
