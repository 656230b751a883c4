"""python -m harness warmup: the Triton variants of a parity plan, found as Triton's JIT keys them
and compiled once into Triton's cache. No GPU here: a dry run for sm90 (``--target``: inputs on
the CPU, kernels compiled for sm90) exercises the same collect and compile paths."""
from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest

from tests.helpers import ROOT, harness_cli, subprocess_env

PLAN = ["--op", "qk_norm_rope", "--generated", "0", "--case", "dsv4-"]  # 11 catalog cases, decode and verify


def _cli(args, tmp_path, timeout=600):
    env = subprocess_env(OMP_NUM_THREADS="1", TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    return harness_cli(args, env=env, timeout=timeout)


def _cubins(tmp_path) -> set[str]:
    return {p.parent.name for p in (tmp_path / "triton-cache").rglob("*.cubin")}


def test_interpreter_has_nothing_to_warm(tmp_path):
    r = _cli(["warmup", "--device", "cpu", *PLAN], tmp_path)
    assert r.returncode == 0 and "nothing to do" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow  # 24-27 s on the 2-core CPU (2026-12-07): the nightly runs it (VP_TESTS=all) on the GPU it warms;
# pull requests keep the plan's variants (test_warmup_finds_exactly_the_variants_the_parity_run_launches)
@pytest.mark.long
def test_dry_run_compiles_each_variant_once_and_a_second_run_only_hits_the_cache(tmp_path):
    """Every variant the plan launches lands in the cache once (one cubin per variant); a second
    warmup in fresh processes finds the same variants (the keys do not depend on the process) and
    adds nothing to the cache; nor does the JIT compiling those variants on a run's first launches
    (its compiles read the warmup's entries). Planted: preload left out leaves no cubin."""
    r = _cli(["warmup", "--target", "sm90", "--jobs", "2", *PLAN], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"warmup: compiled (\d+)/(\d+) kernel variants", r.stdout)
    assert m and m.group(1) == m.group(2) and int(m.group(1)) >= 2, r.stdout
    first = _cubins(tmp_path)
    assert len(first) == int(m.group(1)), (first, r.stdout)
    assert "qk_norm_rope_kernel: " in r.stdout and "HAS_STORE(2: False,True)" in r.stdout, r.stdout  # decode stores
    again = _cli(["warmup", "--target", "sm90", "--jobs", "2", *PLAN], tmp_path)
    assert again.returncode == 0 and f"compiled {m.group(1)}/{m.group(1)} " in again.stdout, again.stdout
    assert _cubins(tmp_path) == first
    # the JIT's own path (a run's first launch of each variant) compiles from those entries: nothing new
    env = subprocess_env(OMP_NUM_THREADS="1", TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    jit = subprocess.run([sys.executable, "-c", JIT_RUN], cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert jit.returncode == 0 and jit.stdout.split()[-1] == m.group(1), jit.stdout + jit.stderr[-3000:]
    assert _cubins(tmp_path) == first


# In a dry-run process: the fused qk_norm_rope impls on the plan's cases as a run calls them, the JIT
# compiling each variant on its first launch (the launch itself then fails: no driver); prints the compiles.
JIT_RUN = textwrap.dedent('''
    import copy
    from harness.gpu import warmup_worker
    warmup_worker.dry_run("sm90")
    from triton import knobs
    from cases import profiles
    from harness.parity import suite
    from harness.ops import default_registry

    reg = default_registry(with_plugins=False)
    dev, spec = warmup_worker.dry_device("sm90"), reg.ops["qk_norm_rope"]
    compiled = []
    knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw["key"])
    for p in suite.plan_cases(spec, profiles.current("ci"), generated=0):
        if "dsv4-" in p.display:
            for impl in ("qk_norm_rope/fused", "qk_norm_rope/fused-device-checked"):  # the plan's fused impls
                try:
                    reg.impls[impl].fn(**copy.deepcopy(spec.build_inputs(p.case, dev)))
                except AttributeError as exc:  # the dry run's driver cannot launch
                    assert "launcher" in str(exc), exc
    print("jit compiles", len(set(compiled)))
''')


# In a dry-run process: the variants the parity run's own calls (runners.run_case: first call,
# determinism/poisoned-alloc rerun, poisoned run with caller-provided outputs) launch, against those
# the warmup's calls find. Nothing launches (the hook skips), so the run's checks fail; only the keys count.
SAME_VARIANTS = textwrap.dedent('''
    import sys
    from harness.gpu import warmup_worker
    warmup_worker.dry_run("sm90")
    from triton import knobs
    from harness.parity import runners, suite
    from harness.ops import default_registry
    from cases import profiles

    reg = default_registry(with_plugins=False)
    dev = warmup_worker.dry_device("sm90")
    suite.set_worker_state(dev, reg)
    op = sys.argv[1]
    impls = [i for i in reg.for_op(op) if i.kind in ("fused", "external")]
    cases = [p.case for p in suite.plan_cases(reg.ops[op], profiles.current("ci"), generated=int(sys.argv[2]))]
    found, _, _ = warmup_worker.collect((op, [i.key for i in impls], cases))
    runners.synchronize = lambda dev: None  # no device queue in a dry run
    seen = {}
    knobs.runtime.jit_cache_hook = lambda **kw: seen.setdefault((kw["fn"].name, kw["key"]), 1) and True
    for case in cases:
        runners.run_impls(reg.ops[op], impls, case, dev)
    want, got = set(seen), {(v.qualname, v.key) for v in found}
    print(len(want), len(got), "missing", len(want - got), "extra", len(got - want))
    sys.exit(0 if want == got and want else 1)
''')


def test_warmup_finds_exactly_the_variants_the_parity_run_launches(tmp_path):
    """Planted: the warmup copying inputs with ``.clone()`` instead of ``copy.deepcopy`` (a strided
    view comes out contiguous: another stride specialisation) misses an mla_fp8_prepare variant."""
    for op, generated in (("mla_fp8_prepare", 8), ("verify_attention", 4)):
        r = subprocess.run([sys.executable, "-c", SAME_VARIANTS, op, str(generated)], cwd=ROOT, capture_output=True,
                           text=True, env=subprocess_env(OMP_NUM_THREADS="1"), timeout=600)
        assert r.returncode == 0, f"{op}: {r.stdout}{r.stderr[-3000:]}"


def test_head_grouping_does_not_multiply_verify_attention_compiles(tmp_path):
    """The KV-head group (H / Hkv) is a runtime argument of the verify kernels, neither a constexpr
    nor specialised (``do_not_specialize``): groups 4, 8 and 16 share their variants, which differ
    only in the tile shape (BLOCK_H) the group picks. As a constexpr it multiplied the ci profile's
    verify_attention variants from 154 to 227 (dry run for sm90). Planted: the group back as a
    ``tl.constexpr`` lists ``KV_GROUP_NUM(3: 16,4,8)`` among what varies."""
    r = _cli(["warmup", "--target", "sm90", "--list", "--jobs", "1", "--op", "verify_attention", "--generated", "0",
              "--case", "qwen35-tp-", "--impl", "fused-shared-kv"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verify_prefix_kernel: " in r.stdout and "BLOCK_H(" in r.stdout, r.stdout
    assert not re.search(r"(?i)kv_group_num\(", r.stdout), r.stdout


def test_big_catalog_cases_are_tasks_of_their_own_and_go_first(registry):
    """Workers take the collect's tasks in order: every ``big`` catalog case (inputs of seconds) is a
    task alone, ahead of every chunk, so the longest tasks start first. Planted: chunking the plan
    in order (big cases inside a 20-case chunk) or appending them last fails."""
    from cases import base, profiles
    from harness.gpu import warmup

    ops = ["qk_norm_rope", "verify_attention"]
    impls = [registry.impls[k] for k in ("qk_norm_rope/fused", "verify_attention/fused")]
    tasks = warmup.plan_tasks(registry, ops, impls, profiles.PROFILES["nightly"], generated=45)
    big = {op: {base.case_id(op, c) for c in registry.ops[op].catalog(big=True)}
           - {base.case_id(op, c) for c in registry.ops[op].catalog(big=False)} for op in ops}
    assert all(big.values())
    alone = [t for t in tasks if len(t[2]) == 1 and base.case_id(t[0], t[2][0]) in big[t[0]]]
    assert tasks[:len(alone)] == alone and sum(map(len, big.values())) == len(alone)
    n = sum(len(t[2]) for t in tasks)
    assert n == sum(len(registry.ops[op].catalog(big=True)) + 45 for op in ops)
    assert max(len(t[2]) for t in tasks) == warmup.CASES_PER_TASK
