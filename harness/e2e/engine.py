"""Greedy decoding, plain and speculative, over the KV model of the store-timing timelines
(``reference.kv_model``: unified ring for DeepSeek-V4, translated paged pool for K3, paged for
Qwen3.5), with every prepare and attention launch taken from a ``harness.timelines.runner.Path``: any
registered implementation (reference, fused, external, mutant) per op, run through the path's
backend (``harness.backend.Backend``: store policy, rollback, positions, slots, gates — the one
the timelines check).

Speculative step for one request (width L + 1, uniform across the batch as the kernels need):
  chunk = [t, d1 .. dL]  t = the last produced token (not in the KV yet), d = the drafter's guesses
  p = argmax logits of the chunk; accept d_i while d_i == p_(i-1); k accepted -> the tokens
  d1 .. dk, p_k are produced (acceptance length k + 1); t, d1 .. dk are committed, the rejected
  drafts are rolled back (``Backend.rollback``: their slots freed, or kept visible by the stale-KV
  path mutant).
Prefill always runs the reference attention (setup, as in the timelines); greedy decode runs the
path's attention in decode mode (1-source), verify in target-verify mode (2-source).

Sampled decoding (``generate(..., sampling=Sampling(temperature, seed))``, temperature > 0): plain
decode draws each token from softmax(logits / T) (``torch.multinomial``, fp32); a speculative step
hands the chunk's L + 1 logits rows to the path's ``spec_sampling`` implementation (``Path.sampler``:
the reference chain, the fused kernel, a mutant) with the drafter's q one-hot on each draft (the
drafters here are deterministic: q(x) = 1 at the draft, so the draft is accepted with probability
p(x) and a rejection samples max(p − onehot, 0) normalised — exact speculative sampling) and a fresh
seed per step from the run's generator; the sampler's output ids up to its accept length are the
step's tokens. ``Sampling.record`` > 0 keeps, for the first ``record`` tokens of each request, the
logits row each was drawn from and the draft at its position (``Trace``: the distribution test of
``harness.e2e.stats``), and keeps a request running past EOS until it has that many tokens (a fixed
count: the test's exactness needs it; the answer is still cut at EOS).

The window is the model's ``max_len``: every chunk sees the whole sequence, so a token attends to
the same positions whether it arrives in a decode or inside a verify chunk.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

import torch

from harness.timelines import path as path_mod
from harness.backend import branch_mode
from harness.e2e import tokenizer as tok
from harness.timelines.prepare import attention_spec, chunk_kv, kv_views, prepare_of, row_shape
from harness.e2e.model import Micro
from reference import kv_model
from reference.spec_sampling.chain import SEED_MAX


@dataclass(frozen=True)
class Sampling:
    """Decoding at temperature > 0 (module docstring)."""
    temperature: float  # > 0 (0 is greedy: no Sampling)
    seed: int  # the run's generator: plain draws and one sampler seed per speculative step
    record: int = 0  # tokens per request traced for the distribution test (a request runs at least this many)

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature: expected a finite value > 0, got {self.temperature}")
        if self.record < 0:
            raise ValueError(f"record: expected >= 0, got {self.record}")


@dataclass(frozen=True)
class Trace:
    """The first ``Sampling.record`` tokens of one request and what each was drawn from."""
    tokens: torch.Tensor  # (M,) int64 emitted ids, EOS and past it included
    drafts: torch.Tensor  # (M,) int64 the draft at the token's position; -1: none (plain, first token, bonus)
    logits: torch.Tensor  # (M, V) fp32 on the CPU: the row the token was sampled from (softmax(row / T))


@dataclass(frozen=True)
class Generation:
    tokens: tuple[tuple[int, ...], ...]  # produced ids per request, cut after EOS and at max_new
    accept_lens: tuple[tuple[int, ...], ...]  # per request: tokens produced by each verify step (k + 1) before EOS
    steps: int  # forward launches after prefill
    traces: tuple[Trace, ...] = ()  # per request, when sampling with record > 0

    @property
    def mean_accept_len(self) -> float:
        a = [x for r in self.accept_lens for x in r]
        return sum(a) / len(a) if a else float("nan")


@contextlib.contextmanager
def _cpu_threads(device: torch.device, n: int = 1):
    """Micro-model launches are tiny: on a shared 2-core CPU, intra-op threads cost 40x more than
    they save (a (15, 256) x (256, 768) float64 matmul: 16 ms on 2 threads, 0.4 ms on 1)."""
    if device.type != "cpu":
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _cut(ids: list[int], max_new: int) -> tuple[int, ...]:
    ids = ids[:max_new]
    return tuple(ids[: ids.index(tok.EOS) + 1] if tok.EOS in ids else ids)


class Engine:
    def __init__(self, model: Micro, path: path_mod.Path, *, L: int = 4, device="cpu",
                 fp8_dtype=torch.float8_e4m3fn, num_kv_splits: int | None = None):
        """``num_kv_splits``: every attention launch's split count (None: the family's)."""
        self.model, self.path, self.L, self.device = model, path, L, torch.device(device)
        self.backend = path.backend
        self.fam = model.fam
        self.splits = num_kv_splits or self.fam.splits
        if path.family != model.cfg.layout:
            raise ValueError(f"path {path.name} is for {path.family}, the model is {model.cfg.layout}")
        self.kv_dtype = fp8_dtype if prepare_of(self.fam).fp8_rows else torch.bfloat16

    # ------------------------------------------------------------------ public
    @torch.no_grad()
    def generate(self, prompts: list[list[int]], max_new: int, drafter=None,
                 sampling: Sampling | None = None) -> Generation:
        """Greedy output for each prompt, or sampled (``sampling``); speculative (L drafts per verify)
        when a drafter is given."""
        if sampling is not None and sampling.record > max_new:
            raise ValueError(f"sampling.record: expected <= max_new = {max_new}, got {sampling.record}")
        if sampling is not None and drafter is not None and self.path.sampler is None:
            raise ValueError(f"path {self.path.name}: speculative sampling needs a sampler (Path.sampler)")
        with _cpu_threads(self.device):
            return self._generate(prompts, max_new, drafter, sampling)

    def _generate(self, prompts, max_new, drafter, sampling):
        B = len(prompts)
        rec = sampling.record if sampling is not None else 0
        gen = torch.Generator().manual_seed(sampling.seed) if sampling is not None else None
        out = [[] for _ in range(B)]
        trace = [([], [], []) for _ in range(B)]  # per request: tokens, drafts, logits rows (the first rec)

        def emit(r, tokens, drafts, rows):
            if len(trace[r][0]) < rec:
                room = rec - len(trace[r][0])
                trace[r][0].extend(tokens[:room])
                trace[r][1].extend(drafts[:room])
                trace[r][2].append(rows[:room].float().cpu())
            out[r] += tokens

        logits = self.prefill(prompts, max_new)
        ends = torch.tensor([len(p) for p in prompts]).cumsum(0) - 1
        first = logits[ends]
        for r, t in enumerate(self._pick(first, sampling, gen)):
            emit(r, [t], [-1], first[r: r + 1])
        acc = [[] for _ in range(B)]
        steps = 0
        while True:
            live = [r for r in range(B) if len(out[r]) < max_new and (tok.EOS not in out[r] or len(out[r]) < rec)]
            if not live:
                break
            steps += 1
            if drafter is None:
                logits = self._forward("decode", [(r, [out[r][-1]]) for r in live])
                for i, (r, t) in enumerate(zip(live, self._pick(logits, sampling, gen))):
                    emit(r, [t], [-1], logits[i: i + 1])
                continue
            chunks = []
            for r in live:
                d = list(drafter.propose(r, prompts[r], out[r], self.L))
                if len(d) != self.L:
                    raise ValueError(f"drafter proposed {len(d)} tokens, expected L = {self.L}")
                chunks.append((r, [out[r][-1]] + d))
            logits = self._forward("target_verify", chunks).view(len(live), self.L + 1, -1)
            if sampling is None:
                steps_out = [self._accept_greedy(chunk, p) for (_, chunk), p in zip(chunks, logits.argmax(-1).tolist())]
            else:
                steps_out = self._accept_sampled(chunks, logits, sampling.temperature, gen)
            for i, ((r, chunk), tokens) in enumerate(zip(chunks, steps_out)):
                k = len(tokens) - 1
                if tok.EOS not in out[r]:
                    acc[r].append(k + 1)
                emit(r, tokens, (chunk[1:] + [-1])[: k + 1], logits[i, : k + 1])
                self.n[r] -= self.L - k  # the committed length: t and the k accepted drafts
                self.backend.rollback(self.kv, r, self.n[r])
        traces = () if not rec else tuple(
            Trace(torch.tensor(t, dtype=torch.int64), torch.tensor(d, dtype=torch.int64), torch.cat(x))
            for t, d, x in trace)
        return Generation(tuple(_cut(o, max_new) for o in out), tuple(tuple(a) for a in acc), steps, traces)

    def _pick(self, logits: torch.Tensor, sampling: Sampling | None, gen) -> list[int]:
        """One token per row: argmax (greedy), or a draw from softmax(row / T) (fp32, ``gen``)."""
        if sampling is None:
            return logits.argmax(-1).tolist()
        p = torch.softmax(logits.float().cpu() / sampling.temperature, dim=-1)
        return torch.multinomial(p, 1, generator=gen)[:, 0].tolist()

    def _accept_greedy(self, chunk: list[int], pred: list[int]) -> list[int]:
        """Greedy acceptance: drafts while each equals the argmax before it, then the argmax."""
        k = 0
        while k < self.L and chunk[k + 1] == pred[k]:
            k += 1
        return pred[: k + 1]

    def _accept_sampled(self, chunks, logits: torch.Tensor, temperature: float, gen) -> list[list[int]]:
        """Speculative sampling by the path's sampler (module docstring): per chunk its accepted drafts and
        the sampled token. An id outside [0, V) where the sampler says a token is raises."""
        n_req, V = logits.shape[0], logits.shape[-1]
        d = torch.tensor([c[1:] for _, c in chunks], dtype=torch.int64, device=logits.device)
        q = torch.nn.functional.one_hot(d, V).float()  # the deterministic drafter's q: 1 at the draft
        seed = int(torch.randint(0, SEED_MAX, (), generator=gen))
        res = self.path.sampler.fn(target_logits=logits.float().contiguous(),
                                   temperature=torch.full((n_req,), float(temperature), device=logits.device),
                                   draft_probs=q, draft_tokens=d, seed=seed)
        ids, n = res["output_ids"].tolist(), res["accept_length"].tolist()
        out = []
        for i, (k, row) in enumerate(zip(n, ids)):
            if not (0 <= k <= self.L and all(0 <= t < V for t in row[: k + 1])):
                raise ValueError(f"sampler {self.path.sampler.name}: request {chunks[i][0]} accept_length {k}, "
                                 f"output_ids {row}: expected k in [0, {self.L}] and ids in [0, {V}) up to k")
            out.append(row[: k + 1])
        return out

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], max_new: int = 0) -> torch.Tensor:
        """Fresh KV (room for ``max_new`` more tokens each), the prompts prefilled -> logits (sum len, V)."""
        B, W, fam = len(prompts), self.model.cfg.max_len, self.fam
        top = max(len(p) for p in prompts) + max_new + self.L + 1
        if top > W:
            raise ValueError(f"prompt + max_new + L + 1 = {top} exceeds the model's window/max_len {W}")
        self.kv = kv_model.KVModel(kv_model.KVLayout(fam.layout, B, W, self.L + 1, row_shape(fam),
                                                     self.kv_dtype, translated=fam.translated), fam.layers, top,
                                   self.device)
        self.n = [0] * B
        return self._forward("extend", [(r, list(p)) for r, p in enumerate(prompts)])

    # ------------------------------------------------------------------ one batch
    def _forward(self, mode: str, items: list[tuple[int, list[int]]]) -> torch.Tensor:
        kv, dev = self.kv, self.device
        positions, logical, owners, ids = [], [], [], []
        be = self.backend
        for r, chunk in items:
            positions += be.positions(r, self.n[r], len(chunk))
            logical.append(be.alloc(kv, r, self.n[r], len(chunk)))
            ids += chunk
            owners.append((r, len(chunk)))
        pos_t = torch.tensor(positions, dtype=torch.int64, device=dev)
        loc_logical = torch.cat(logical)
        loc_phys = be.physical(kv, loc_logical)
        # the slots each chunk reads are the same in every layer: built once per forward (per read rule)
        meta = functools.lru_cache(maxsize=None)(lambda as_history: be.read_meta(kv, owners, loc_logical, as_history,
                                                                                  dev))
        x = self.model.embed(torch.tensor(ids, device=dev))
        for layer in range(self.fam.layers):
            x = self._layer(mode, layer, x, pos_t, loc_logical, loc_phys, meta)
            x = self.model.mlp(layer, x)
        for r, c in owners:  # the whole chunk is history now; verify rolls the rejected part back
            self.n[r] += c
            kv.rollback(r, self.n[r])
        return self.model.logits(x)

    def _layer(self, mode, layer, x, pos_t, loc_logical, loc_phys, meta):
        fam, m, kv, be = self.fam, self.model, self.kv, self.backend
        buf = kv.buffers[layer]
        pr = m.project(layer, x)
        branch = be.branch(fam, mode, layer)
        if branch == "non-unified":
            raise ValueError(f"backend {be.name}: layer {layer} on the non-unified branch; the engine's layouts "
                             f"have unified layers only")
        rows, q, kv_returned = prepare_of(fam).serve(self, branch_mode(branch, mode), layer, pr, pos_t, loc_logical,
                                                     loc_phys, buf)
        pol = be.policy(fam, mode, kv_returned)
        if pol.backend_stores and pol.store_first:
            be.store(buf, loc_phys, rows)
        k_d, v_d = chunk_kv(fam, buf[loc_phys.clamp(min=0)] if pol.one_source else rows)
        o = self._attend(mode, q, k_d, v_d, buf, meta, pol.policy == "as-history")
        if pol.backend_stores and not pol.store_first and pol.policy != "none":
            be.store(buf, loc_phys, rows)
        return m.attn_out(layer, x, o)

    def _attend(self, mode, q, k_d, v_d, buf, meta, as_history: bool):
        """Attention over each request's history (+ the other chunk tokens, when the chunk is history)."""
        fam = self.fam
        kb, vb = kv_views(fam, buf)
        qo_indptr, kv_indptr, kv_indices = meta(as_history)
        args = dict(q=q.contiguous(), k=k_d.contiguous(), v=v_d.contiguous(), k_buffer=kb, v_buffer=vb,
                    qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, sm_scale=1.0 / math.sqrt(fam.D),
                    is_causal=fam.causal, k_scale=fam.kv_descale, v_scale=fam.kv_descale, num_kv_splits=self.splits,
                    custom_mask=None, o=None, topk=1, model_family=fam.model_family, splitkv_switch=True)
        fn = attention_spec().reference if mode == "extend" else self.path.attn.fn
        return fn(**args)["o"]
