"""The end-to-end gate on the micro-engine: per layout and path, accuracy (95 % interval),
exact agreement of the speculative output with the reference path's plain greedy output, mean
acceptance length, and the paired exact McNemar test against the reference path; one
``reports.rows.GateRow`` each. Thresholds and profiles: ``cases.e2e_gate``.

Per layout: the reference path (reference prepare + reference attention) runs plain greedy
once (the agreement target) and speculatively (the McNemar baseline); every other path and path
mutant runs speculatively with n-gram-table + copy drafts (``drafters.NGramLookup``, built from
the train split) on the same problems, or on the first ``profile.kernel_problems`` of them for a
run that launches Triton kernels (judged on exactly those; its row's ``problems`` and detail say
so). A path mutant is expected to fail; ``expect`` says so and the CLI exits non-zero when any
verdict differs.

At temperature > 0 (``profile.temperature``; ``_sampled_rows``) the baseline is plain sampling on the
reference path and every path samples speculatively through its implementation of the sampler op
(``sampler_op``: ``spec_sampling``; label ``prepare+attn+sampler``; the profile's ``sampler_mutants``
are samplers on ``mutant_kernels``); a row holds accuracy and McNemar against plain sampling, and the distribution
test of the path's first ``profile.record`` tokens per request (``stats.pit`` / ``stats.uniformity``);
``verdict_sampled`` judges it. Every run's randomness is seeded from ``seed`` and the run's key
(``run_seed``): a run repeats exactly.
"""
from __future__ import annotations

import functools
import hashlib
import math
import time
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from cases import e2e_gate as cfg
from cases import gsm8k_synth as g
from cases import timelines as tl
from cases.mutants import timelines as mt
from harness import backend as backend_mod
from harness.timelines import path as path_mod
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


def generate(model, path, prompts, max_new, drafter, batch, device, num_kv_splits=None,
             sampling: E.Sampling | None = None) -> E.Generation:
    """``sampling``: its seed is the first batch's; batch k draws with seed + k."""
    toks, acc, steps, traces = [], [], 0, []
    for k, i in enumerate(range(0, len(prompts), batch)):
        part = prompts[i: i + batch]
        d = drafter(i) if callable(drafter) else drafter
        smp = None if sampling is None else replace(sampling, seed=sampling.seed + k)
        out = E.Engine(model, path, device=device, num_kv_splits=num_kv_splits).generate(part, max_new, drafter=d,
                                                                                          sampling=smp)
        toks += out.tokens
        acc += out.accept_lens
        steps += out.steps
        traces += out.traces
    return E.Generation(tuple(toks), tuple(acc), steps, tuple(traces))


def sampler_op(reg) -> str:
    """The op with role ``sampler``: the speculative sampler of every sampled path (``Path.sampler``)."""
    found = reg.by_role("sampler")
    if len(found) != 1:
        raise LookupError(f"expected one op with role 'sampler', got {[s.name for s in found]}")
    return found[0].name


def paths_for(reg, layout: str, profile: cfg.GateProfile) -> list[tuple[str, path_mod.Path, str]]:
    """(label, path, expect) for every path under test, reference first. ``profile.backend``
    (``--backend module:attr``): the backend the profile's paths run through (the reference path
    keeps the clean one: the baseline every path is judged against). At temperature > 0 a label is
    ``prepare+attn+sampler`` and the path carries that implementation of the sampler op
    (``sampler_op``); its mutants (``profile.sampler_mutants``, and any in ``impl_mutants``) run on
    ``mutant_kernels`` as the sampler, labelled by registry key (a greedy profile skips them: its paths
    never sample)."""
    sampled = profile.temperature > 0
    op = sampler_op(reg)
    ref = path_mod.clean_path(reg, layout, prepare="reference", attn="reference")
    out = [("reference+reference+reference", replace(ref, sampler=reg.impls[f"{op}/reference"]), "pass")
           if sampled else ("reference+reference", ref, "pass")]
    be = backend_mod.load(profile.backend) if profile.backend else backend_mod.CLEAN
    for spec in profile.paths:
        prep, attn, *smp = spec.split("+")
        label = spec if be is backend_mod.CLEAN else f"{spec}:{be.name}"
        path = path_mod.clean_path(reg, layout, prepare=prep, attn=attn, backend=be)
        out.append((label, replace(path, sampler=reg.impls[f"{op}/{smp[0]}"]) if smp else path, "pass"))
    sampler = out[0][1].sampler
    for name in profile.path_mutants:
        m = next(x for x in mt.PATH_MUTANTS if x.name == name)
        if layout in m.families:
            prep, attn = profile.mutant_kernels.split("+")
            path = replace(path_mod.clean_path(reg, layout, prepare=prep, attn=attn, backend=m),
                           name=f"{layout}:{name}", doc=m.doc, sampler=sampler)
            out.append((name, path, "fail"))
    fam = tl.FAMILIES[layout]
    for key in [f"{op}/{name}" for name in profile.sampler_mutants] + list(profile.impl_mutants):
        impl = reg.impls[key]
        if impl.op == op:
            if sampled:
                prep, attn = profile.mutant_kernels.split("+")
                clean = path_mod.clean_path(reg, layout, prepare=prep, attn=attn)
                out.append((key, replace(clean, name=f"{layout}:{key}", doc=impl.doc, sampler=impl), "fail"))
            continue
        is_attn = reg.ops[impl.op].role == "attn"
        if not is_attn and impl.op != fam.prepare:
            continue  # this layout's path never runs the op
        clean = path_mod.clean_path(reg, layout)
        slot = dict(attn=impl) if is_attn else dict(prepare=impl)
        out.append((key, replace(clean, name=f"{layout}:{key}", doc=impl.doc, sampler=sampler, **slot), "fail"))
    return out


def tie_divergences(model, ref_path, prompts, greedy, other, margin: float, device, num_kv_splits=None,
                    batch: int = 64) -> int:
    """How many disagreeing problems first differ at a token whose top-2 logit margin on the
    reference greedy path is below ``margin``: one reference prefill of every disagreeing
    problem's prompt + greedy prefix, ``batch`` problems per prefill (a mutant path disagrees on
    almost every problem: one prefill each took minutes of the H200 nightly's gate)."""
    items = []
    for p, a, b in zip(prompts, greedy, other):
        if a == b:
            continue
        j = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), None)
        if j is None:  # one is a prefix of the other: an EOS decision, not an argmax near-tie
            continue
        items.append(list(p) + list(a[:j]))
    n = 0
    for i in range(0, len(items), batch):
        part = items[i: i + batch]
        logits = E.Engine(model, ref_path, device=device, num_kv_splits=num_kv_splits).prefill(part)
        last = torch.tensor([len(x) for x in part], device=logits.device).cumsum(0) - 1  # each prompt's last row
        top = logits[last].topk(2, dim=-1).values
        n += int((top[:, 0] - top[:, 1] < margin).sum())
    return n


def verdict(th: cfg.Thresholds, *, trained: bool, acc: stats.Accuracy, agreement: float, accept: float,
            mc: stats.McNemar, ties: float = 0.0) -> tuple[str, str]:
    """``agreement`` exact; ``ties`` the fraction of problems whose divergence is a near-tie (excused)."""
    fails, notes = [], []
    if agreement + ties < th.min_agreement:
        fails.append(f"agreement {agreement:.3f} (+{ties:.3f} near-ties) < {th.min_agreement}")
    elif ties:
        notes.append(f"{ties:.3f} of problems diverge at a near-tie (margin < {th.tie_margin})")
    if mc.p_value < th.alpha and mc.worse > mc.better:
        fails.append(f"McNemar p={mc.p_value:.2g} < {th.alpha} ({mc.worse} worse, {mc.better} better)")
    if trained and acc.value < th.min_accuracy:
        fails.append(f"accuracy {acc.value:.3f} < {th.min_accuracy}")
    if trained and not accept >= th.min_accept_len:
        fails.append(f"mean accept {accept:.2f} < {th.min_accept_len}")
    if not trained:
        notes.append("random-init model: accuracy and acceptance thresholds not applied")
    return ("fail" if fails else "pass"), "; ".join(fails + notes)


def verdict_sampled(th: cfg.Thresholds, *, trained: bool, acc: stats.Accuracy, accept: float, mc: stats.McNemar,
                    dist: stats.Uniformity, plain: stats.Uniformity | None = None) -> tuple[str, str]:
    """Temperature > 0 (``cases.e2e_gate``): the distribution test of the path's emitted tokens, McNemar
    against plain sampling, the trained-model floors. ``plain``: the baseline's own distribution test
    (plain sampling), judged on the reference path's row (a broken baseline fails there)."""
    fails, notes = [], []
    if not dist.passed(th.dist_alpha):
        fails.append(f"emitted tokens do not follow softmax(logits/T): adjusted p 10^{dist.log10_p:.1f} <= "
                     f"{th.dist_alpha:g} over {dist.tokens} tokens (worst: {dist.worst})")
    else:
        notes.append(f"distribution: adjusted p 10^{dist.log10_p:.2f} over {dist.tokens} tokens")
    if plain is not None:
        if not plain.passed(th.dist_alpha):
            fails.append(f"plain sampling (the baseline): adjusted p 10^{plain.log10_p:.1f} <= {th.dist_alpha:g} "
                         f"(worst: {plain.worst})")
        else:
            notes.append(f"plain sampling: adjusted p 10^{plain.log10_p:.2f} over {plain.tokens} tokens")
    if mc.p_value < th.alpha and mc.worse > mc.better:
        fails.append(f"McNemar p={mc.p_value:.2g} < {th.alpha} ({mc.worse} worse, {mc.better} better)")
    if trained and acc.value < th.min_accuracy:
        fails.append(f"accuracy {acc.value:.3f} < {th.min_accuracy}")
    if trained and not accept >= th.min_accept_len:
        fails.append(f"mean accept {accept:.2f} < {th.min_accept_len}")
    if not trained:
        notes.append("random-init model: accuracy and acceptance thresholds not applied")
    return ("fail" if fails else "pass"), "; ".join(fails + notes)


def run_seed(seed: int, *key) -> int:
    """A stable 31-bit seed for one run's randomness: ``seed`` and the run's key (layout, label, purpose),
    the same in every process (``hash`` of a str is not)."""
    return zlib.crc32(repr((seed,) + key).encode()) & 0x7FFFFFFF


_DRAFTER: D.NGramLookup | None = None


def shared_drafter() -> D.NGramLookup:
    """The gate's drafter, built once per process (measured on qwen35-gqa, 25 problems: mean
    acceptance 2.30 vs 1.89 with prompt lookup alone)."""
    global _DRAFTER
    if _DRAFTER is None:
        _DRAFTER = D.NGramLookup.from_train_split()
    return _DRAFTER


@functools.lru_cache(maxsize=None)
def _model(layout: str, models_dir: str, device) -> M.Micro:
    """The layout's model, loaded once per process (tasks of one run share it; inference never
    writes its weights)."""
    return load_model(layout, models_dir, device)[0]


@functools.lru_cache(maxsize=4)
def gate_problems(n: int) -> tuple[list[list[int]], list[str]]:
    data = g.load("test", limit=n)
    return [tok.encode(tok.prompt(r["question"])) for r in data], [r["answer"] for r in data]


def _generation(task) -> tuple[E.Generation, float]:
    """One generation run (a worker's unit): (layout, label or None for the reference greedy run,
    profile, models dir, problem count, first, end) -> (tokens/acceptance of problems [first, end),
    seconds)."""
    from harness.parity import suite

    layout, label, profile, models_dir, n, lo, hi, seed = task
    dev, reg = suite.worker_state()
    model = _model(layout, models_dir, dev.torch_device)
    listed = paths_for(reg, layout, profile)
    paths = {lab: path for lab, path, _ in listed}
    prompts = gate_problems(n)[0][lo:hi]
    t0 = time.time()
    path = listed[0][1] if label is None else paths[label]
    sampling = None if profile.temperature == 0 else E.Sampling(
        profile.temperature, run_seed(seed, layout, label, "sampling", lo), record=profile.record)
    out = generate(model, path, prompts, profile.max_new, None if label is None else shared_drafter(), profile.batch,
                   dev.torch_device, profile.num_kv_splits, sampling=sampling)
    return out, time.time() - t0


def _run_cost(run: tuple, kernels: bool, interpreted: bool) -> int:
    """Relative cost of a (layout, label) run, for ordering only: label None is the plain greedy run."""
    return (10 if kernels and interpreted else 0) + (2 if run[1] is None else 0) + (1 if kernels else 0)


def run(reg, dev, profile: cfg.GateProfile, layouts=cfg.LAYOUTS, *, models_dir=cfg.MODEL_DIR, seed: int = 0,
        problems: int | None = None, progress=None, jobs: int = 1) -> list[GateRow]:
    """Every (layout, path) generation, then the rows. ``jobs`` > 1 runs the generations (the
    reference greedy run and each path's speculative run) in that many spawned processes: on a
    GPU the engine's time is host-side, so paths of one layout run side by side."""
    from harness.parity.suite import provenance

    prov = provenance(dev, profile, seed).__dict__
    n = problems or profile.problems
    prompts, golds = gate_problems(n)
    # one task per (layout, run, batch of problems): with jobs > 1 the batches of one run go side by side too;
    # the longest runs first, so that no long run starts last (a run's batches stay in order: the results are
    # concatenated): under the interpreter the runs that launch Triton kernels (~10x a reference run), on a
    # GPU the plain greedy run (one step per token; measured on the H200 nightly: 183-205 s against 74-157 s
    # for each speculative run of 600 problems)
    runs = [(layout, label) for layout in layouts
            for label in [None] + [lab for lab, _, _ in paths_for(reg, layout, profile)]]
    kernels = {(layout, lab) for layout in layouts for lab, path, _ in paths_for(reg, layout, profile)
               if any(i is not None and i.kind != "reference" for i in (path.prepare, path.attn))}
    # problems per run: the first kernel_problems for a kernel run (the same list, so the same problems)
    count = {r: min(n, profile.kernel_problems or n) if r in kernels else n for r in runs}
    tasks = [(layout, label, profile, str(models_dir), n, lo, min(count[layout, label], lo + profile.batch), seed)
             for layout, label in sorted(runs, key=lambda r: -_run_cost(r, r in kernels, dev.interpreted))
             for lo in range(0, count[layout, label], profile.batch)]
    parts: dict[tuple, list] = {}

    done = [0]
    base = "reference plain sampling" if profile.temperature > 0 else "reference greedy"

    def collect(t, res):
        parts.setdefault(t[:2], []).append((t[5], res))  # batches complete in any order: sorted by lo below
        done[0] += 1
        if progress:  # every batch: a long run shows where it is (a whole run can take minutes)
            progress(f"[{done[0]}/{len(tasks)}] {t[0]} {t[1] or base}: problems {t[6]} of {count[t[:2]]} "
                     f"(batch {res[1]:.1f}s, run so far {sum(s for _, (_, s) in parts[t[:2]]):.0f}s)")

    from harness.parity import suite

    if jobs <= 1:
        suite.set_worker_state(dev, reg)
        for t in tasks:
            collect(t, _generation(t))
    else:
        from harness import pool

        for k, res in suite.spawn_map(_generation, tasks, jobs, dev):  # as each batch completes
            if isinstance(res, pool.Lost):  # no time limit here: the worker process died
                raise RuntimeError(f"gate batch {tasks[k][:2]} problems {tasks[k][5]}-{tasks[k][6]}: {res.detail}")
            collect(tasks[k], res)
    parts = {key: [res for _, res in sorted(ps, key=lambda x: x[0])] for key, ps in parts.items()}
    results = {key: (E.Generation(tuple(x for g, _ in ps for x in g.tokens), tuple(x for g, _ in ps for x in g.accept_lens),
                                  sum(g.steps for g, _ in ps), tuple(x for g, _ in ps for x in g.traces)),
                     sum(s for _, s in ps)) for key, ps in parts.items()}
    if profile.temperature > 0:
        return _sampled_rows(results, count, profile, layouts, models_dir, golds, reg, dev, seed, prov, progress)
    rows = []
    for layout in layouts:
        model, model_id, trained = load_model(layout, models_dir, dev.torch_device)
        paths = paths_for(reg, layout, profile)
        greedy = results[(layout, None)][0]
        ref_ok = None
        for label, path, expect in paths:
            out, secs = results[(layout, label)]
            m = count[layout, label]  # this run's problems: the first m; every number below is on exactly those
            assert len(out.tokens) == m, (layout, label, len(out.tokens), m)
            texts = [tok.decode(t) for t in out.tokens]
            ok = [answers.correct(answers.strict(x), gold) for x, gold in zip(texts, golds[:m])]
            ref_ok = ok if ref_ok is None else ref_ok  # the reference path: never a kernel run, all n problems
            acc, mc = stats.accuracy(ok), stats.mcnemar(ref_ok[:m], ok)
            agreement = sum(a == b for a, b in zip(out.tokens, greedy.tokens[:m])) / m
            accept = out.mean_accept_len
            ties = tie_divergences(model, paths[0][1], prompts[:m], greedy.tokens[:m], out.tokens,
                                   profile.thresholds.tie_margin, dev.torch_device, profile.num_kv_splits,
                                   batch=profile.batch)
            v, why = verdict(profile.thresholds, trained=trained, acc=acc, agreement=agreement, accept=accept, mc=mc,
                             ties=ties / m)
            if m < n:
                why = "; ".join(x for x in (f"{'interpreter: ' if dev.interpreted else ''}Triton kernels on the "
                                            f"first {m} of {n} problems (kernel_problems)", why) if x)
            rows.append(GateRow(layout=layout, path=label, expect=expect, model=model_id, drafter="ngram-lookup",
                                extraction="strict", problems=m, accuracy=acc.value, accuracy_lo=acc.lo,
                                accuracy_hi=acc.hi, ref_accuracy=sum(ref_ok[:m]) / m,
                                exact_agreement=agreement, tie_divergences=ties,
                                mean_accept_len=accept if not math.isnan(accept) else -1.0,
                                worse=mc.worse, better=mc.better, p_value=mc.p_value, temperature=0.0,
                                dist_tokens=0, dist_log10_p=0.0, verdict=v, detail=why,
                                seconds=round(secs, 2), **prov))
            if progress:
                r = rows[-1]
                progress(f"{layout} {label}: acc {r.accuracy:.3f} agree {r.exact_agreement:.3f} accept "
                         f"{r.mean_accept_len:.2f} p {r.p_value:.2g} -> {r.verdict} (expect {expect}) "
                         f"{r.seconds:.0f}s")
    return rows


def distribution(gen: E.Generation, temperature: float, seed: int, *key) -> stats.Uniformity:
    """The distribution test of one run's traced tokens; the PIT's own draws seeded by (seed, key)."""
    rng = np.random.default_rng(run_seed(seed, *key, "pit"))
    return stats.uniformity(stats.pit(gen.traces, temperature, rng))


def _sampled_rows(results, count, profile, layouts, models_dir, golds, reg, dev, seed, prov, progress) -> list[GateRow]:
    """Temperature > 0: per layout and path, accuracy and McNemar against plain sampling on the reference
    path (the run labelled None), and the distribution test of the path's traced tokens."""
    th, T = profile.thresholds, profile.temperature
    rows = []
    for layout in layouts:
        _, model_id, trained = load_model(layout, models_dir, dev.torch_device)
        plain = results[(layout, None)][0]
        m_plain = len(plain.tokens)
        plain_ok = [answers.correct(answers.strict(tok.decode(t)), gold) for t, gold in zip(plain.tokens, golds)]
        plain_dist = distribution(plain, T, seed, layout, None)
        for i, (label, path, expect) in enumerate(paths_for(reg, layout, profile)):
            out, secs = results[(layout, label)]
            m = count[layout, label]
            assert len(out.tokens) == m <= m_plain, (layout, label, len(out.tokens), m)
            ok = [answers.correct(answers.strict(tok.decode(t)), gold) for t, gold in zip(out.tokens, golds[:m])]
            acc, mc = stats.accuracy(ok), stats.mcnemar(plain_ok[:m], ok)
            dist = distribution(out, T, seed, layout, label)
            accept = out.mean_accept_len
            v, why = verdict_sampled(th, trained=trained, acc=acc, accept=accept, mc=mc, dist=dist,
                                     plain=plain_dist if i == 0 else None)
            if m < m_plain:
                cut = (f"{'interpreter: ' if dev.interpreted else ''}Triton kernels on the first {m} of {m_plain} "
                       f"problems (kernel_problems)")
                why = f"{cut}; {why}" if why else cut
            rows.append(GateRow(layout=layout, path=label, expect=expect, model=model_id, drafter="ngram-lookup",
                                extraction="strict", problems=m, accuracy=acc.value, accuracy_lo=acc.lo,
                                accuracy_hi=acc.hi, ref_accuracy=sum(plain_ok[:m]) / m, exact_agreement=-1.0,
                                tie_divergences=-1, mean_accept_len=accept if not math.isnan(accept) else -1.0,
                                worse=mc.worse, better=mc.better, p_value=mc.p_value, temperature=T,
                                dist_tokens=dist.tokens, dist_log10_p=dist.log10_p, verdict=v, detail=why,
                                seconds=round(secs, 2), **prov))
            if progress:
                r = rows[-1]
                progress(f"{layout} {label} T={T}: acc {r.accuracy:.3f} (plain {r.ref_accuracy:.3f}) accept "
                         f"{r.mean_accept_len:.2f} McNemar p {r.p_value:.2g} distribution p 10^{r.dist_log10_p:.1f} "
                         f"-> {r.verdict} (expect {expect}) {r.seconds:.0f}s")
    return rows
