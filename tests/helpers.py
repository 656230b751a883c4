"""Small helpers for the harness's own tests."""
from __future__ import annotations

from harness import runners


def failed_checks(spec, impl, case, device) -> list[str]:
    res = runners.run_case(spec, impl, case, device)
    assert not res.refused, f"{impl.key} refused {case}: {res.refused}"
    return [r.check for r in res.records if not r.passed]


def assert_passes(spec, impl, case, device) -> None:
    res = runners.run_case(spec, impl, case, device)
    assert not res.refused, f"{impl.key} refused {case}: {res.refused}"
    bad = [r for r in res.records if not r.passed]
    assert not bad, "\n".join(f"{r.check}: err={r.err:.4g} allowed={r.allowed:.4g} {r.detail} {r.worst}" for r in bad)
    assert res.records, "no check ran"
