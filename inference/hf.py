"""The Hugging Face rollout engine: a batched KV-cache sampler over a ``transformers`` causal LM.

For Llama-family models (llama, qwen2, qwen3 with full attention, sdpa/eager attention) it runs the model's own
decoder layers directly (``inference.layers``) with a static cache and its own masks, skipping the per-call mask
building and cache bookkeeping of ``model.forward``; the prefill is flat (``inference.flat``: each shared prefix
once, no padding). Other architectures go through ``model.forward`` with a ``DynamicCache``. Both paths drop
finished rows from the batch as responses end. CPU (tests, demos, small models) and GPU.
"""

from __future__ import annotations

import inspect
from typing import Sequence

import numpy as np
import torch

from inference.batching import micro_batches
from inference.flat import build_layout, run_layout
from inference.layers import DecodeLayer, fast_path_unsupported_reason, rms_norm, rotate_half_matrix
from inference.protocol import TOP_K_OFF, Completion, check_generate_args, prompt_budgets, resolve_top_k
from inference.stops import eos_list

__all__ = ["HFSampler", "RowStreams", "draw", "sample_next_token"]


def sample_next_token(
    logits: torch.Tensor,  # [b, V] float32
    *,
    temperature: float,
    top_p: float,
    top_k: int = TOP_K_OFF,
    generator: torch.Generator | None = None,
    u: torch.Tensor | None = None,  # [b] float64 uniforms in [0, 1), one per row (instead of ``generator``)
) -> torch.Tensor:  # [b] int64
    """Draw one token per row. temperature 0 is greedy (argmax). top_k >= 1 keeps the k most probable tokens (and
    any tied with the k-th), top_p < 1 then keeps the smallest set of the most probable of those whose renormalised
    mass reaches top_p (always at least the top token), and the draw is renormalised over what is kept: the order
    of transformers' warpers (temperature, TopKLogitsWarper, TopPLogitsWarper) and of vLLM's sampler
    (``apply_top_k_top_p``: top-k masks the logits, top-p is computed on the softmax of what is left). top_k 0 or -1
    is off (``inference.protocol.resolve_top_k``). Each row uses one uniform, from ``u`` or else ``generator``."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    top_k = resolve_top_k(top_k)
    if top_k != TOP_K_OFF and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]   # [b, 1] the k-th largest logit of each row
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p >= 1.0:
        return draw(torch.softmax(logits, dim=-1), generator, u=u)
    sorted_logits, sorted_idx = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # probability of the strictly more likely tokens
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    choice = draw(sorted_probs, generator, u=u)  # index into the sorted order
    return sorted_idx.gather(1, choice[:, None]).squeeze(1)


def draw(probs: torch.Tensor, generator: torch.Generator | None = None, *, u: torch.Tensor | None = None
         ) -> torch.Tensor:
    """One index per row of ``probs`` [b, V] (non-negative, need not sum to 1), with probability proportional to
    its entry: inverse-CDF sampling, one uniform per row (``u`` [b] in [0, 1), else drawn from ``generator``)
    against the float64 running sum (float64 so that rare tokens keep their probability over large
    vocabularies). A zero entry is never drawn. On CPU this is ~10x faster than ``torch.multinomial``, which draws
    an exponential variate for every entry."""
    cdf = probs.to(torch.float64).cumsum(dim=-1)
    total = cdf[:, -1:]
    if not bool(((total > 0) & torch.isfinite(total)).all()):   # as torch.multinomial refuses them
        raise ValueError("cannot sample: a row of probabilities is NaN, infinite or all zero (NaN or inf logits "
                         "from the model? check its weights and dtype)")
    if u is None:
        u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64, device=probs.device)
    else:
        u = u.to(device=probs.device, dtype=torch.float64).view(-1, 1)
    return torch.searchsorted(cdf, u * total, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


# SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014; the generator
# java.util.SplittableRandom uses): state += GAMMA, output = mix64(state). Computed in numpy's uint64, whose
# arithmetic wraps modulo 2**64 by definition, so the same uniforms come out on every device and platform.
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix64(z: np.ndarray) -> np.ndarray:   # uint64 -> uint64, SplitMix64's finaliser
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class RowStreams:
    """Per-row random streams, counter-based: row r's t-th uniform is SplitMix64's t-th output from the state
    mix64(seeds[r]), a function of (seeds[r], t) alone. What a row samples therefore depends on its own seed and
    the model only: not on the rows it is batched with, its position, the chunking, or which rows finished
    first. One vectorised hash per decode step, whatever the number of rows (no generator objects)."""

    def __init__(self, keys: np.ndarray):   # [b] uint64, mix64 of each row's seed
        self.keys = keys

    @classmethod
    def from_seeds(cls, seeds: Sequence[int]) -> "RowStreams":
        return cls(_mix64(np.array([int(s) for s in seeds], dtype=np.uint64)))

    def take(self, idx: Sequence[int]) -> "RowStreams":
        return RowStreams(self.keys[np.asarray(idx, dtype=np.int64)])

    def uniforms(self, rows: np.ndarray, t: int) -> torch.Tensor:   # [len(rows)] float64 in [0, 1)
        with np.errstate(over="ignore"):
            z = _mix64(self.keys[rows] + np.uint64(t + 1) * _GAMMA)
        return torch.from_numpy((z >> np.uint64(11)).astype(np.float64) * 2.0 ** -53)


class _DecodeBook:
    """Decode bookkeeping shared by both HF paths for one chunk of rows: what each row generated, which rows are
    still alive (no EOS yet, budget left), why each stopped, and optionally every sampled token's log-prob and
    entropy. ``rows`` maps the current (shrinking) batch to chunk rows."""

    def __init__(self, b: int, max_new: int, limits: torch.Tensor, eos_ids: list[int], pad_id: int, device,
                 logprobs: bool, rng: "torch.Generator | RowStreams"):
        self.rng = rng   # the call's one generator (``seed``), or this chunk's per-row streams (``seeds``)
        self.rows_np = np.arange(b)   # ``rows`` on the host, where per-row streams are indexed
        self.out = torch.full((b, max_new), pad_id, dtype=torch.long, device=device)
        self.n_gen = torch.full((b,), max_new, dtype=torch.long, device=device)
        self.stopped = torch.zeros(b, dtype=torch.bool, device=device)
        self.rows = torch.arange(b, device=device)
        self.alive = torch.ones(b, dtype=torch.bool, device=device)
        self.limits = limits
        self.eos = torch.tensor(eos_ids, dtype=torch.long, device=device)
        self.logp = torch.full((b, max_new), float("nan"), device=device) if logprobs else None
        self.ent = torch.full((b, max_new), float("nan"), device=device) if logprobs else None

    def step(self, t: int, logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
        """Sample token t of every current row from ``logits`` [b_cur, V] and record it; returns the tokens."""
        rows, alive = self.rows, self.alive
        per_row = isinstance(self.rng, RowStreams)
        u = self.rng.uniforms(self.rows_np, t) if per_row and temperature > 0 else None
        gen = None if per_row else self.rng
        if self.logp is not None and temperature > 0 and top_p >= 1.0 and top_k == TOP_K_OFF:
            # sample_next_token's own arithmetic (same draws), keeping the probabilities it sampled from
            probs = torch.softmax(logits / temperature, dim=-1)
            tok = draw(probs, gen, u=u)
        else:
            tok = sample_next_token(logits, temperature=temperature, top_p=top_p, top_k=top_k, generator=gen,
                                    u=u)  # [b_cur]
            probs = torch.softmax(logits / temperature if temperature > 0 else logits, dim=-1) \
                if self.logp is not None else None
        self.out[rows, t] = tok
        if probs is not None:   # log pi(token) and the entropy -sum p log p (entr(0) = 0), at the temperature
            self.logp[rows, t] = probs.gather(1, tok[:, None]).squeeze(1).log()
            self.ent[rows, t] = torch.special.entr(probs).sum(-1)
        hit = alive & torch.isin(tok, self.eos)
        full = alive & ~hit & (self.limits[rows] <= t + 1)  # this row's own budget is spent
        self.n_gen[rows] = torch.where(hit | full, t + 1, self.n_gen[rows])
        self.stopped[rows] |= hit
        self.alive = alive & ~(hit | full)
        return tok

    def any_alive(self) -> bool:
        return bool(self.alive.any())

    def advance(self, t: int, logits: torch.Tensor, temperature: float, top_p: float, top_k: int):
        """``step`` t, then what the decode loop needs: None when decoding is over (last step or no row alive),
        else (the tokens of the rows that go on, the indices of those rows when some were dropped, else None)."""
        tok = self.step(t, logits, temperature, top_p, top_k)
        if t == self.out.shape[1] - 1 or not self.any_alive():
            return None
        keep = self.drop_finished()
        return (tok if keep is None else tok[keep]), keep

    def drop_finished(self) -> torch.Tensor | None:
        """Once an eighth of the current batch has finished, the indices of the rows to keep (else None)."""
        b_cur = self.alive.shape[0]
        n_alive = int(self.alive.sum())
        if b_cur - n_alive < max(1, b_cur // 8):
            return None
        keep = self.alive.nonzero().squeeze(1)
        self.rows, self.alive = self.rows[keep], self.alive[keep]
        if isinstance(self.rng, RowStreams):
            self.rows_np = self.rows.cpu().numpy()
        return keep

    def completions(self) -> list[Completion]:
        out_l, n_l, stop_l = self.out.tolist(), self.n_gen.tolist(), self.stopped.tolist()
        lp = self.logp.tolist() if self.logp is not None else None
        ent = self.ent.tolist() if self.ent is not None else None
        return [Completion(row[:n], "stop" if s else "length",
                           None if lp is None else lp[i][:n], None if ent is None else ent[i][:n])
                for i, (row, n, s) in enumerate(zip(out_l, n_l, stop_l))]


def _make_generator(seed: int | None, device: torch.device) -> torch.Generator:
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()  # fresh non-deterministic seed; the global RNG is never touched
    else:
        gen.manual_seed(int(seed))
    return gen


def _kwarg_name(fn, new: str, old: str) -> str:
    """transformers renamed `past_key_values` to `cache` in 5.x (both accepted until 5.40); use what fn names."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return new
    return new if new in params else old


class _StaticKV:
    """Preallocated KV cache, [b, n_kv_heads, capacity, head_dim] per layer, duck-typed to what the attention
    modules call (`update`). Prompts sit right-aligned in slots [0, L) (L = longest prompt of the batch), generated
    tokens follow in slot order, so one slot index serves every row and a decode step writes one column."""

    def __init__(self, n_layers: int, b: int, n_kv: int, cap: int, head_dim: int, dtype, device,
                 zero: bool = True):
        # zeros where a prefill leaves the slots left of a short prompt unwritten: garbage (NaN) there would leak
        # through the attention product even with a zero weight. The flat prefill writes every slot below L
        # (finite values, masked) and decoding writes each slot before reading it, so it needs no zeroing
        new = torch.zeros if zero else torch.empty
        self.k = [new(b, n_kv, cap, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.v = [new(b, n_kv, cap, head_dim, dtype=dtype, device=device) for _ in range(n_layers)]
        self.length = 0  # filled slots (decode)
        self.prefill_rows: tuple[int, int] | None = None  # rows [r0, r1) being prefilled ...
        self.prefill_start = 0  # ... into slots [prefill_start, L)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def update(self, key, value, layer_idx, *args, **kwargs):  # key/value: [b, n_kv, q, head_dim]
        if self.prefill_rows is not None:
            r0, r1 = self.prefill_rows
            s0 = self.prefill_start
            self.k[layer_idx][r0:r1, :, s0 : s0 + key.shape[2]] = key
            self.v[layer_idx][r0:r1, :, s0 : s0 + key.shape[2]] = value
            return key, value  # a prefill group attends only to its own tokens
        n = self.length
        self.k[layer_idx][:, :, n : n + 1] = key
        self.v[layer_idx][:, :, n : n + 1] = value
        return self.k[layer_idx][:, :, : n + 1], self.v[layer_idx][:, :, : n + 1]

    def select_rows(self, keep: torch.Tensor) -> None:
        self.k = [t.index_select(0, keep) for t in self.k]
        self.v = [t.index_select(0, keep) for t in self.v]

    def grow(self, new_cap: int) -> None:
        def _grow(t):
            out = t.new_zeros(t.shape[0], t.shape[1], new_cap, t.shape[3])
            out[:, :, : self.length] = t[:, :, : self.length]
            return out

        self.k = [_grow(t) for t in self.k]
        self.v = [_grow(t) for t in self.v]


class HFSampler:
    """Batched KV-cache sampler for Hugging Face causal LMs.

    The engine shares the trainer's module: `update_weights(model)` only re-points to it (no copy), so samples
    always come from the weights the module holds at the time of the call. During `generate` the module is put in
    eval mode (no dropout) and its previous mode is restored afterwards.

    Prompts are sorted by length and processed in chunks of `max_batch_size` rows (shorter padding); inside a
    chunk rows of similar length are prefilled together (each group padded only to its own longest prompt) with
    positions counted from each row's first real token, so left padding changes nothing. Finished rows are
    dropped from the batch (cache rows included) once an eighth of it has finished.

    Randomness never touches the global RNG. With `seeds` (one per prompt) each row draws from its own
    counter-based stream (`RowStreams`): a row's completion depends on its prompt, its seed and the model only, not
    on the other rows, its position, `max_batch_size` or which rows finished first (up to float rounding of the
    batched matmuls, as for greedy). With `seed` alone one local `torch.Generator` serves the whole call: the
    same seed, model and prompt list give the same completions, but a row's draws depend on the batch it is in.
    Greedy outputs do not depend on the batch composition (up to float rounding in matmuls).

    Give it an unsharded module. An FSDP-sharded one falls back to `model.forward`, where every forward is a
    collective: ranks would have to run the same number of decode steps, which row dropping does not guarantee.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        eos_token_id: int | Sequence[int],
        pad_token_id: int,
        max_batch_size: int = 256,
        ignore_eos: bool = False,  # sample every row to its budget (benchmarks, exact token accounting)
        fast: bool | None = None,  # None: the direct layer loop when supported; False: always model.forward
        prefill_tokens: int = 2048,  # tokens (rows x padded length) per prefill forward; bounds activation memory
    ):
        eos = eos_list(eos_token_id)
        if not eos:
            raise ValueError("eos_token_id is required (an int or a list of ints)")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.eos_token_ids = [] if ignore_eos else eos
        self.pad_token_id = int(pad_token_id)
        self.max_batch_size = int(max_batch_size)
        self.prefill_tokens = int(prefill_tokens)
        self._fast_request = fast
        self.update_weights(model)

    # -- public API ---------------------------------------------------------------------------------------------

    def update_weights(self, model: torch.nn.Module) -> None:
        """Re-point to `model` (the trainer's own module; nothing is copied)."""
        self.model = model
        reason = fast_path_unsupported_reason(model)
        if self._fast_request and reason is not None:
            raise ValueError(f"HFSampler(fast=True) cannot drive this model directly: {reason}")
        self.fast = reason is None if self._fast_request is None else bool(self._fast_request)
        self._fast_reason = reason
        self._forward_cache_kw = _kwarg_name(model.forward, "cache", "past_key_values")
        try:
            self._has_logits_to_keep = "logits_to_keep" in inspect.signature(model.forward).parameters
        except (TypeError, ValueError):
            self._has_logits_to_keep = False
        if self.fast:
            self._layer_cache_kw = _kwarg_name(model.model.layers[0].forward, "cache", "past_key_values")

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        *,
        max_new_tokens: int | Sequence[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = TOP_K_OFF,
        seed: int | None = None,
        logprobs: bool = False,
        prefix_lens: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        """``top_k``: keep the k most likely tokens before top-p (``sample_next_token``; 0 or -1: off); log-probs
        are of the whole distribution at the temperature, before top-k and top-p.

        ``prefix_lens[i]``: how many leading tokens of prompt i are a prefix that other prompts share (e.g. the
        question before a Thinking Seeds seed); the prefill computes each distinct prefix once. Default: the whole
        prompt, so only equal prompts share. A hint: the completions are the same whatever it says.

        ``seeds[i]``: prompt i's own random stream (``RowStreams``); ``seed`` is then not used."""
        check_generate_args(prompts, max_new_tokens, temperature, top_p, seeds, top_k)
        top_k = resolve_top_k(top_k)
        if prefix_lens is not None and len(prefix_lens) != len(prompts):
            raise ValueError(f"prefix_lens has {len(prefix_lens)} entries for {len(prompts)} prompts")
        budgets = prompt_budgets(prompts, max_new_tokens)
        empty = [] if logprobs else None
        results: list[Completion | None] = [Completion([], "length", empty, empty) if m == 0 else None
                                            for m in budgets]
        if all(m == 0 for m in budgets):
            return results  # type: ignore[return-value]
        device = next(self.model.parameters()).device
        rng = RowStreams.from_seeds(seeds) if seeds is not None else _make_generator(seed, device)
        # longest first, stable: chunks hold prompts of similar length
        order = sorted((i for i in range(len(prompts)) if budgets[i] > 0), key=lambda i: -len(prompts[i]))
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for c0 in range(0, len(order), self.max_batch_size):
                    idx = order[c0 : c0 + self.max_batch_size]
                    chunk = [list(prompts[i]) for i in idx]
                    limits = torch.tensor([budgets[i] for i in idx], device=device)
                    crng = rng.take(idx) if isinstance(rng, RowStreams) else rng
                    if self.fast:
                        pre = None if prefix_lens is None else [prefix_lens[i] for i in idx]
                        comps = self._generate_fast(chunk, limits, (temperature, top_p, top_k), crng, device,
                                                    logprobs, pre)
                    else:
                        comps = self._generate_generic(chunk, limits, (temperature, top_p, top_k), crng, device,
                                                       logprobs)
                    for i, comp in zip(idx, comps):
                        results[i] = comp
        finally:
            self.model.train(was_training)
        return results  # type: ignore[return-value]

    # -- internals ----------------------------------------------------------------------------------------------

    def _generate_fast(self, chunk, limits, sampling, rng, device, logprobs,
                       prefix_lens=None) -> list[Completion]:
        """``sampling``: (temperature, top_p, top_k), as ``_DecodeBook.advance`` takes them."""
        max_new = int(limits.max())
        model = self.model
        inner = model.model
        cfg = model.config
        b = len(chunk)
        lens = [len(p) for p in chunk]  # sorted, longest first
        L = lens[0]
        dtype = inner.embed_tokens.weight.dtype
        neg = torch.finfo(dtype).min
        n_layers = len(inner.layers)
        n_kv = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        total = L + max_new
        cap = L + min(max_new, 512)  # grown geometrically if responses run long
        decode_layers = None
        if all(DecodeLayer.supports(layer) for layer in inner.layers):
            fuse = sum(p.numel() for p in model.parameters()) <= DecodeLayer.FUSE_MAX_PARAMS
            decode_layers = [DecodeLayer(layer, fuse=fuse) for layer in inner.layers]
        cache = _StaticKV(n_layers, b, n_kv, cap, head_dim, dtype, device, zero=decode_layers is None)
        ckw = {self._layer_cache_kw: cache}

        # rotary tables for every position this chunk can reach (static rope types only, see fast path check)
        cos_t, sin_t = inner.rotary_emb(
            torch.zeros(1, 1, cfg.hidden_size, dtype=dtype, device=device),
            torch.arange(total, device=device)[None],
        )
        cos_t, sin_t = cos_t[0], sin_t[0]  # [total, head_dim]

        lens_t = torch.tensor(lens, device=device)
        # additive decode mask over cache slots: a row sees its own prompt slots [L - len, L) and all generated ones
        slot = torch.arange(cap, device=device)
        mask_add = torch.zeros(b, 1, 1, cap, dtype=dtype, device=device)
        mask_add.masked_fill_((slot[None, :] < (L - lens_t)[:, None])[:, None, None, :], neg)

        # ---- prefill
        if decode_layers is not None:   # flat: no padding, each shared prefix once (inference.flat)
            logits = self._prefill_flat(chunk, prefix_lens, cache, L, device)
        else:
            logits = self._prefill_padded(chunk, lens, cache, ckw, cos_t, sin_t, L, neg, device)
        cache.length = L

        # ---- decode
        final_norm = rms_norm(inner.norm) if decode_layers is not None else inner.norm
        book = _DecodeBook(b, max_new, limits, self.eos_token_ids, self.pad_token_id, device, logprobs, rng)
        next_pos = lens_t.clone()  # position id of the next token per buffer row
        rot = rotate_half_matrix(head_dim, dtype, device)

        def per_kv_head(m):  # [b, 1, 1, cap] -> [b * n_kv, 1, cap], the decode layers' layout
            return m.expand(m.shape[0], n_kv, 1, m.shape[-1]).reshape(-1, 1, m.shape[-1])

        mask_kv = per_kv_head(mask_add)
        for t in range(max_new):
            nxt = book.advance(t, logits, *sampling)
            if nxt is None:
                break
            tok, keep = nxt
            if keep is not None:
                cache.select_rows(keep)
                mask_add = mask_add.index_select(0, keep)
                mask_kv = per_kv_head(mask_add)
                next_pos = next_pos[keep]
            if cache.length + 1 > cache.capacity:
                new_cap = min(total, 2 * cache.capacity)
                cache.grow(new_cap)
                mask_add = torch.cat(
                    [mask_add, mask_add.new_zeros(mask_add.shape[0], 1, 1, new_cap - mask_add.shape[-1])], dim=-1
                )
                mask_kv = per_kv_head(mask_add)
            h = inner.embed_tokens(tok[:, None])
            cos, sin = cos_t[next_pos][:, None], sin_t[next_pos][:, None]   # [b, 1, head_dim]
            if decode_layers is not None:
                m = mask_kv[..., : cache.length + 1]
                for dl in decode_layers:
                    h = dl(h, cos, sin, rot, cache, m)
            else:
                m = mask_add[..., : cache.length + 1]
                for layer in inner.layers:
                    h = layer(h, attention_mask=m, position_embeddings=(cos, sin), **ckw)
                    if isinstance(h, tuple):
                        h = h[0]
            cache.length += 1
            next_pos = next_pos + 1
            logits = model.lm_head(final_norm(h[:, -1])).float()
        return book.completions()

    def _prefill_flat(self, chunk, prefix_lens, cache: "_StaticKV", L: int, device) -> torch.Tensor:
        """Next-token logits [b, V] of every row, its keys and values written right-aligned into cache slots
        [0, L). Rows are split as shared prefix + own suffix (``prefix_lens``; default the whole prompt, so equal
        prompts are computed once) and run flat (``inference.flat``) in pieces of at most ``prefill_tokens``."""
        model = self.model
        if prefix_lens is None:
            cut = [len(p) for p in chunk]
        else:   # at least one prefix token (the flat layout's prompt part is never empty)
            cut = [max(1, min(int(k), len(p))) for p, k in zip(chunk, prefix_lens)]
        pre, suf = [p[:k] for p, k in zip(chunk, cut)], [p[k:] for p, k in zip(chunk, cut)]
        pieces, _ = micro_batches([(len(a), len(x)) for a, x in zip(pre, suf)], rows=len(chunk),
                                  tokens=self.prefill_tokens, prompt_keys=[tuple(a) for a in pre])
        neg = torch.finfo(model.model.embed_tokens.weight.dtype).min
        logits = torch.empty(len(chunk), model.config.vocab_size, dtype=torch.float32, device=device)
        for idx in pieces:
            lay = build_layout([pre[i] for i in idx], [suf[i] for i in idx], device=device, neg=neg, prefill=True)
            # cache slot j of row i holds its token j - (L - len_i); slots before a row's first token read flat
            # token 0 and stay masked (``mask_add``)
            src = torch.tensor([[0] * (L - len(x)) + x for x in lay.seq], dtype=torch.long, device=device)
            rows = torch.tensor(idx, dtype=torch.long, device=device)

            def sink(layer_idx, k, v, src=src, rows=rows):   # k, v [N, n_kv, d]
                for store, x in ((cache.k, k), (cache.v, v)):
                    part = x.index_select(0, src.view(-1)).view(*src.shape, *x.shape[1:]).transpose(1, 2)
                    store[layer_idx][rows, :, :L] = part

            logits[rows] = run_layout(model, lay, kv_sink=sink).float()
        return logits

    def _prefill_padded(self, chunk, lens, cache: "_StaticKV", ckw, cos_t, sin_t, L, neg, device) -> torch.Tensor:
        """The model's own decoder layers over left-padded groups of rows of similar length (layers the flat
        path cannot drive): next-token logits [b, V], keys and values written into the cache."""
        model, inner = self.model, self.model.model
        b, dtype = len(chunk), inner.embed_tokens.weight.dtype
        lens_t = torch.tensor(lens, device=device)
        logits = torch.empty(b, model.config.vocab_size, dtype=torch.float32, device=device)
        r0 = 0
        while r0 < b:
            Lg = lens[r0]
            rows = max(1, min(b - r0, self.prefill_tokens // Lg))
            r1 = r0 + rows
            ids = torch.tensor(
                [[self.pad_token_id] * (Lg - len(p)) + p for p in chunk[r0:r1]], dtype=torch.long, device=device
            )
            pad = (Lg - lens_t[r0:r1])[:, None]  # [rows, 1]
            ar = torch.arange(Lg, device=device)
            pos = (ar[None, :] - pad).clamp(min=0)  # [rows, Lg]
            key_ok = ar[None, :] >= pad  # [rows, Lg]
            allowed = (ar[None, :, None] >= ar[None, None, :]) & key_ok[:, None, :]  # causal & not padding
            allowed |= torch.eye(Lg, dtype=torch.bool, device=device)[None]  # pad queries see themselves: no NaN
            m = torch.zeros(rows, 1, Lg, Lg, dtype=dtype, device=device).masked_fill_(~allowed[:, None], neg)
            cache.prefill_rows, cache.prefill_start = (r0, r1), L - Lg
            h = inner.embed_tokens(ids)
            pe = (cos_t[pos], sin_t[pos])
            for layer in inner.layers:
                h = layer(h, attention_mask=m, position_embeddings=pe, **ckw)
                if isinstance(h, tuple):  # older transformers return (hidden, ...)
                    h = h[0]
            logits[r0:r1] = model.lm_head(inner.norm(h[:, -1])).float()
            r0 = r1
        cache.prefill_rows = None
        return logits

    def _generate_generic(self, chunk, limits, sampling, rng, device, logprobs) -> list[Completion]:
        """Any causal LM: model.forward with a DynamicCache, left padding and explicit position ids. ``sampling``:
        (temperature, top_p, top_k)."""
        max_new = int(limits.max())
        from transformers import DynamicCache

        model = self.model
        b = len(chunk)
        lens = [len(p) for p in chunk]
        L = max(lens)
        ids = torch.full((b, L), self.pad_token_id, dtype=torch.long)
        am = torch.zeros(b, L + max_new, dtype=torch.long)
        for j, p in enumerate(chunk):
            ids[j, L - len(p) :] = torch.tensor(p, dtype=torch.long)
            am[j, L - len(p) :] = 1  # generated slots count as attended from the start
        ids, am = ids.to(device), am.to(device)
        pos = (am[:, :L].cumsum(1) - 1).clamp(min=0)
        cache = DynamicCache(config=model.config)
        extra = {"logits_to_keep": 1} if self._has_logits_to_keep else {}
        ckw = {self._forward_cache_kw: cache}
        o = model(input_ids=ids, attention_mask=am[:, :L], position_ids=pos, use_cache=True, **ckw, **extra)
        logits = o.logits[:, -1].float()

        book = _DecodeBook(b, max_new, limits, self.eos_token_ids, self.pad_token_id, device, logprobs, rng)
        next_pos = pos[:, -1] + 1
        for t in range(max_new):
            nxt = book.advance(t, logits, *sampling)
            if nxt is None:
                break
            tok, keep = nxt
            if keep is not None:
                cache.batch_select_indices(keep)
                am = am.index_select(0, keep)
                next_pos = next_pos[keep]
            o = model(
                input_ids=tok[:, None],
                attention_mask=am[:, : L + t + 1],
                position_ids=next_pos[:, None],
                use_cache=True,
                **ckw,
                **extra,
            )
            next_pos = next_pos + 1
            logits = o.logits[:, -1].float()
        return book.completions()
