"""The end-to-end gate on the micro-engine: per layout and path, accuracy (95 % interval),
exact agreement of the speculative output with the reference path's plain greedy output, mean
acceptance length, and the paired exact McNemar test against the reference path; one
``reports.rows.GateRow`` each. Thresholds and profiles: ``cases.e2e_gate``.

Per layout: the reference path (reference prepare + reference attention) runs plain greedy
once (the agreement target) and speculatively (the McNemar baseline); every other path and path
mutant runs speculatively with prompt-lookup drafts on the same problems. A path mutant is
expected to fail; ``expect`` says so and the CLI exits non-zero when any verdict differs.
"""
from __future__ import annotations

import hashlib
import math
import time
from dataclasses import replace
from pathlib import Path

from cases import e2e_gate as cfg
from cases import gsm8k_synth as g
from cases.mutants import timelines as mt
from harness import timeline
from harness.e2e import answers, stats
from harness.e2e import drafters as D
from harness.e2e import engine as E
from harness.e2e import model as M
from harness.e2e import tokenizer as tok
from reports.rows import GateRow


def load_model(layout: str, models_dir: str | Path = cfg.MODEL_DIR, device="cpu") -> tuple[M.Micro, str, bool]:
    """(model, id, trained): the shipped file when present, else a random-weight model."""
    p = Path(models_dir) / f"{layout}.safetensors"
    if p.exists():
        return M.load(p, device), f"{p.name}@{hashlib.sha256(p.read_bytes()).hexdigest()[:12]}", True
    return M.Micro(M.MicroConfig(layout=layout)).to(device).eval(), "random-init", False


def generate(model, path, prompts, max_new, drafter, batch, device) -> E.Generation:
    toks, acc, steps = [], [], 0
    for i in range(0, len(prompts), batch):
        part = prompts[i: i + batch]
        d = drafter(i) if callable(drafter) else drafter
        out = E.Engine(model, path, device=device).generate(part, max_new, drafter=d)
        toks += out.tokens
        acc += out.accept_lens
        steps += out.steps
    return E.Generation(tuple(toks), tuple(acc), steps)


def paths_for(reg, layout: str, profile: cfg.GateProfile) -> list[tuple[str, timeline.Path, str]]:
    """(label, path, expect) for every path under test, reference first."""
    out = [("reference+reference", timeline.clean_path(reg, layout, prepare="reference", attn="reference"), "pass")]
    for spec in profile.paths:
        prep, attn = spec.split("+")
        out.append((spec, timeline.clean_path(reg, layout, prepare=prep, attn=attn), "pass"))
    for name in profile.path_mutants:
        m = next(x for x in mt.PATH_MUTANTS if x.name == name)
        if layout in m.families:
            prep, attn = profile.mutant_kernels.split("+")
            path = replace(timeline.clean_path(reg, layout, prepare=prep, attn=attn, **m.change),
                           name=f"{layout}:{name}", doc=m.doc)
            out.append((name, path, "fail"))
    return out


def verdict(th: cfg.Thresholds, *, trained: bool, acc: stats.Accuracy, agreement: float, accept: float,
            mc: stats.McNemar) -> tuple[str, str]:
    why = []
    if agreement < th.min_agreement:
        why.append(f"agreement {agreement:.3f} < {th.min_agreement}")
    if mc.p_value < th.alpha and mc.worse > mc.better:
        why.append(f"McNemar p={mc.p_value:.2g} < {th.alpha} ({mc.worse} worse, {mc.better} better)")
    if trained and acc.value < th.min_accuracy:
        why.append(f"accuracy {acc.value:.3f} < {th.min_accuracy}")
    if trained and not accept >= th.min_accept_len:
        why.append(f"mean accept {accept:.2f} < {th.min_accept_len}")
    if not trained:
        why.append("random-init model: accuracy and acceptance thresholds not applied")
    failed = [w for w in why if not w.startswith("random-init")]
    return ("fail" if failed else "pass"), "; ".join(why)


def run(reg, dev, profile: cfg.GateProfile, layouts=M.LAYOUTS, *, models_dir=cfg.MODEL_DIR, seed: int = 0,
        problems: int | None = None, progress=None) -> list[GateRow]:
    from harness.suite import provenance

    prov = provenance(dev, profile, seed).__dict__
    data = g.load("test", limit=problems or profile.problems)
    prompts = [tok.encode(tok.prompt(r["question"])) for r in data]
    golds = [r["answer"] for r in data]
    rows = []
    for layout in layouts:
        model, model_id, trained = load_model(layout, models_dir, dev.torch_device)
        paths = paths_for(reg, layout, profile)
        t0 = time.time()
        greedy = generate(model, paths[0][1], prompts, profile.max_new, None, profile.batch, dev.torch_device)
        if progress:
            progress(f"{layout}: reference greedy on {len(prompts)} problems ({time.time() - t0:.0f}s)")
        ref_ok = None
        for label, path, expect in paths:
            t0 = time.time()
            out = generate(model, path, prompts, profile.max_new, D.PromptLookup(), profile.batch, dev.torch_device)
            texts = [tok.decode(t) for t in out.tokens]
            ok = [answers.correct(answers.strict(x), gold) for x, gold in zip(texts, golds)]
            ref_ok = ok if ref_ok is None else ref_ok
            acc, mc = stats.accuracy(ok), stats.mcnemar(ref_ok, ok)
            agreement = sum(a == b for a, b in zip(out.tokens, greedy.tokens)) / len(prompts)
            accept = out.mean_accept_len
            v, why = verdict(profile.thresholds, trained=trained, acc=acc, agreement=agreement, accept=accept, mc=mc)
            rows.append(GateRow(layout=layout, path=label, expect=expect, model=model_id, drafter="prompt-lookup",
                                extraction="strict", problems=len(prompts), accuracy=acc.value, accuracy_lo=acc.lo,
                                accuracy_hi=acc.hi, ref_accuracy=sum(ref_ok) / len(ref_ok),
                                exact_agreement=agreement, mean_accept_len=accept if not math.isnan(accept) else -1.0,
                                worse=mc.worse, better=mc.better, p_value=mc.p_value, verdict=v, detail=why,
                                seconds=round(time.time() - t0, 2), **prov))
            if progress:
                r = rows[-1]
                progress(f"{layout} {label}: acc {r.accuracy:.3f} agree {r.exact_agreement:.3f} accept "
                         f"{r.mean_accept_len:.2f} p {r.p_value:.2g} -> {r.verdict} (expect {expect}) "
                         f"{r.seconds:.0f}s")
    return rows
