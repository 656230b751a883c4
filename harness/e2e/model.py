"""Micro-models for the end-to-end gate: one decoder per target layout, attention layers shaped
like the store-timing families (``cases.timelines.FAMILIES``) so the engine can route every
prepare and attention call through registered implementations.

  dsv4-mqa-ring  DeepSeek-V4 MQA: q, kv projections; qk RMSNorm + interleaved RoPE (``qk_norm_rope``);
                 k = v = the kv row, one unified ring per request
  k3-mla-fp8     Kimi-K3 absorbed MLA: q_nope/q_rope/k_nope/k_rope; neox RoPE on the rope parts here,
                 then ``mla_fp8_prepare`` (fp8 q and KV rows, scale ``kv_descale``), paged translated pool
  qwen35-gqa     Qwen3.5 GQA, one KV head: q, k, v projections, neox RoPE on the last 32 dims, paged pool

Inference math (``Micro.project`` / ``mlp`` / ``logits``) keeps bf16 activations between launches and
does every matmul in float64 before that rounding, so a token's numbers do not depend on how many
rows share the launch (speculative vs one-token greedy agree bit for bit on the reference path).
Training (``Micro.forward``) is the same math in fp32 over whole sequences with dense causal
attention; fp8 rows are fake-quantised with a straight-through gradient.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F

from cases import timelines as tl
from cases.e2e_gate import LAYOUTS
from cases import timeline_family
from harness.timelines.prepare import prepare_of
from harness.e2e import tokenizer as tok
from reference.qk_norm_rope import chain as qk_ref

ROPE = {"dsv4-mqa-ring": ("interleaved", 16), "k3-mla-fp8": ("neox", 16), "qwen35-gqa": ("neox", 32)}
EPS = 1e-6


@dataclass(frozen=True)
class MicroConfig:
    layout: str = "dsv4-mqa-ring"
    d_model: int = 256
    layers: int = 4
    d_ff: int = 768
    max_len: int = 512  # positions (prompt + solution); also the attention window W (see engine)
    vocab: int = tok.VOCAB
    seed: int = 0

    @property
    def family(self) -> timeline_family.Family:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout: expected one of {LAYOUTS}, got {self.layout!r}")
        return replace(tl.FAMILIES[self.layout], d_model=self.d_model, layers=self.layers)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def proj_widths(fam: timeline_family.Family) -> dict[str, int]:
    """Projection name -> width: those the family's prepare step takes (``harness.timelines.prepare.Prepare``)."""
    return prepare_of(fam).projections(fam)


def _rms(x: torch.Tensor, w: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    x = x.to(dtype)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.to(dtype)


def fake_fp8(x: torch.Tensor, scale: float) -> torch.Tensor:
    """fp8 e4m3fn round trip of x / scale, times scale; straight-through gradient (the training forward
    of a prepare step that writes fp8 rows)."""
    q = (x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale
    return x + (q - x).detach()


class Micro(torch.nn.Module):
    def __init__(self, cfg: MicroConfig):
        super().__init__()
        self.cfg, self.fam = cfg, cfg.family
        fam, dm = self.fam, cfg.d_model
        g = torch.Generator().manual_seed(cfg.seed)
        p = {"emb": torch.randn(cfg.vocab, dm, generator=g) * 0.5, "final_norm": torch.ones(dm),
             "head": torch.randn(dm, cfg.vocab, generator=g) / math.sqrt(dm)}
        for i in range(cfg.layers):
            p[f"l{i}.attn_norm"], p[f"l{i}.mlp_norm"] = torch.ones(dm), torch.ones(dm)
            for k, n in proj_widths(fam).items():
                p[f"l{i}.w_{k}"] = torch.randn(dm, n, generator=g) / math.sqrt(dm)
            p[f"l{i}.kv_norm"] = torch.ones(fam.D)
            p[f"l{i}.wo"] = torch.randn(fam.H * fam.Dv, dm, generator=g) / math.sqrt(fam.H * fam.Dv) / cfg.layers
            p[f"l{i}.w1"] = torch.randn(dm, cfg.d_ff, generator=g) / math.sqrt(dm)
            p[f"l{i}.w3"] = torch.randn(dm, cfg.d_ff, generator=g) / math.sqrt(dm)
            p[f"l{i}.w2"] = torch.randn(cfg.d_ff, dm, generator=g) / math.sqrt(cfg.d_ff) / cfg.layers
        self.params = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(v) for k, v in p.items()})
        style, rd = ROPE[cfg.layout]
        self.rope_style, self.rope_dim = style, rd
        inv = 1.0 / (10000.0 ** (torch.arange(rd // 2, dtype=torch.float64) / (rd // 2)))
        ang = torch.arange(cfg.max_len + 8, dtype=torch.float64)[:, None] * inv[None]
        self.register_buffer("cos", ang.cos().float(), persistent=False)
        self.register_buffer("sin", ang.sin().float(), persistent=False)
        self._w64: dict[str, torch.Tensor] = {}

    def w(self, name: str) -> torch.Tensor:
        return self.params[name.replace(".", "_")]

    def w64(self, name: str) -> torch.Tensor:
        """float64 copy of a weight for inference, cached (dropped by ``train()`` and ``load``)."""
        if name not in self._w64:
            self._w64[name] = self.w(name).detach().double()
        return self._w64[name]

    def train(self, mode: bool = True):
        self._w64 = {}
        return super().train(mode)

    # ------------------------------------------------------------------ inference pieces (bf16 between launches)
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.w("emb")[ids].to(torch.bfloat16)  # (T, dm)

    def project(self, i: int, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """x (T, dm) bf16 -> {name: (T, n) bf16}: RMSNorm, then each projection (float64 matmul, one rounding)."""
        h = _rms(x, self.w(f"l{i}.attn_norm"), torch.float64)
        return {k: (h @ self.w64(f"l{i}.w_{k}")).to(torch.bfloat16) for k in proj_widths(self.fam)}

    def rope(self, y: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(T, ..., D) -> bf16 with RoPE on the last rope_dim dims (mla / qwen; dsv4's is inside its op)."""
        return qk_ref.rope_fp32(y.float(), self.cos[positions], self.sin[positions], self.rope_dim,
                                self.rope_style).to(torch.bfloat16)

    def attn_out(self, i: int, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """Residual after attention: x (T, dm) bf16, o (T, H, Dv) bf16 -> (T, dm) bf16."""
        return (x.double() + o.reshape(o.shape[0], -1).double() @ self.w64(f"l{i}.wo")).to(torch.bfloat16)

    def mlp(self, i: int, x: torch.Tensor) -> torch.Tensor:
        h = _rms(x, self.w(f"l{i}.mlp_norm"), torch.float64)
        a = F.silu(h @ self.w64(f"l{i}.w1")) * (h @ self.w64(f"l{i}.w3"))
        return (x.double() + a @ self.w64(f"l{i}.w2")).to(torch.bfloat16)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return _rms(x, self.w("final_norm"), torch.float64) @ self.w64("head")  # (T, V) float64

    # ------------------------------------------------------------------ training forward (fp32, dense)
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (B, N) -> logits (B, N, V) fp32; N <= max_len (the window covers every position)."""
        fam, (B, N) = self.fam, ids.shape
        pos = torch.arange(N, device=ids.device).repeat(B)  # (B·N,)
        x = self.w("emb")[ids].reshape(B * N, -1)
        for i in range(self.cfg.layers):
            h = _rms(x, self.w(f"l{i}.attn_norm"))
            pr = {k: h @ self.w(f"l{i}.w_{k}") for k in proj_widths(fam)}
            q, k, v = prepare_of(fam).train(self, pr, pos, i)  # the family's prepare step, fp32
            rep = fam.H // k.shape[1]
            qh = q.view(B, N, fam.H, -1).transpose(1, 2)  # (B, H, N, D)
            kh = k.view(B, N, -1, k.shape[-1]).repeat_interleave(rep, 2).transpose(1, 2)
            vh = v.reshape(B, N, -1, v.shape[-1]).repeat_interleave(rep, 2).transpose(1, 2)
            o = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=1.0 / math.sqrt(fam.D))
            x = x + o.transpose(1, 2).reshape(B * N, -1) @ self.w(f"l{i}.wo")
            h = _rms(x, self.w(f"l{i}.mlp_norm"))
            x = x + (F.silu(h @ self.w(f"l{i}.w1")) * (h @ self.w(f"l{i}.w3"))) @ self.w(f"l{i}.w2")
        return (_rms(x, self.w("final_norm")) @ self.w("head")).view(B, N, -1)


def save(model: Micro, path, extra: dict | None = None) -> None:
    """safetensors (bf16) + ``<path>.json`` beside it: the config and ``extra`` (data hash, training)."""
    from pathlib import Path

    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.params.items()}
    save_file(tensors, str(path), metadata={"config": model.cfg.to_json()})
    side = {"config": json.loads(model.cfg.to_json()), **(extra or {})}
    path.with_suffix(".json").write_text(json.dumps(side, indent=2, sort_keys=True) + "\n")


def load(path, device="cpu") -> Micro:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        cfg = MicroConfig(**json.loads(f.metadata()["config"]))
        model = Micro(cfg)
        for k in model.params:
            model.params[k].data = f.get_tensor(k).float()
    model._w64 = {}
    return model.to(device).eval()
