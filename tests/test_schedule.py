"""The suite starts the costliest cases first (``harness.parity.suite.schedule``, ``OpSpec.case_cost``) and
returns the rows in plan order all the same. On the H200 the compiled step's 200K-prefix cases (104-105 s
each) started after the cheap ones and held the step past its limit."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from cases import profiles
from harness.parity import suite


def _groups(*costs):
    spec = SimpleNamespace(case_cost=lambda c: c)
    return [(SimpleNamespace(spec=spec, case=c), []) for c in costs]


def test_schedule_is_costliest_first_and_stable_among_equals():
    """Planted: the sort left out (plan order) or made ascending fails; an unstable tie-break fails the tie."""
    assert suite.schedule(_groups(1.0, 5.0, 3.0, 5.0)) == [1, 3, 2, 0]
    none = SimpleNamespace(spec=SimpleNamespace(case_cost=None), case=None)  # an op without a cost: last, in order
    assert suite.schedule(_groups(2.0) + [(none, []), (none, [])] + _groups(4.0)) == [3, 0, 1, 2]


def test_cases_run_costliest_first_and_rows_come_back_in_plan_order(registry, device, monkeypatch):
    """The four catalog cases matching 'head' (costs 1024, 14336, 1152, 1152 elements) run as the schedule
    says, in process; the rows are those of an unscheduled run (case_cost None), in the same order.
    Planted: run() iterating groups unpermuted fails the order; rows filed by arrival fails the equality."""
    ran = []
    local = suite._local_run

    def recording(task):
        ran.append(task[0].case_cost(task[2]) if task[0].case_cost else None)
        return local(task)

    monkeypatch.setattr(suite, "_local_run", recording)
    impls = [registry.impls["qk_norm_rope/fused"]]
    kw = dict(dev=device, profile=profiles.current("dev"), ops=["qk_norm_rope"], impls=impls, generated=0,
              progress=False, case_filter="head")
    rows = suite.run(registry, **kw)
    assert ran == [14336.0, 1152.0, 1152.0, 1024.0]
    monkeypatch.setitem(registry.ops, "qk_norm_rope", replace(registry.ops["qk_norm_rope"], case_cost=None))
    ran.clear()
    unscheduled = suite.run(registry, **kw)
    assert ran == [None] * 4
    key = [(r.case, r.check, r.status) for r in rows]
    assert key == [(r.case, r.check, r.status) for r in unscheduled] and key[0][0].endswith("one-token-one-head")
