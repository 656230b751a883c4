"""Run profiles, chosen by the environment variable ``VP_PROFILE`` (default ``ci``).

``generated`` is how many hypothesis-drawn cases a parity run adds to every catalog case;
``max_examples`` is what property tests in ``tests/`` draw. The same names are registered as
hypothesis settings profiles (``load_hypothesis_profile``, which tests/conftest.py calls), so
``VP_PROFILE=nightly pytest`` deepens the tests too.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # an annotation only
    from harness.registry import OpSpec

ENV = "VP_PROFILE"


@dataclass(frozen=True)
class Profile:
    name: str
    generated: int  # generated parity cases per op (plus the whole catalog)
    max_examples: int  # hypothesis examples per property test
    big: bool  # include the largest catalog shapes (GPU-sized)


PROFILES = {
    "dev": Profile("dev", generated=30, max_examples=10, big=False),
    "ci": Profile("ci", generated=300, max_examples=25, big=False),
    "nightly": Profile("nightly", generated=3000, max_examples=200, big=True),
}


def current(name: str | None = None) -> Profile:
    name = name or os.environ.get(ENV, "ci")
    if name not in PROFILES:
        raise ValueError(f"{ENV}: expected one of {sorted(PROFILES)}, got {name!r}")
    return PROFILES[name]


def generated_count(spec: OpSpec, profile: Profile, *, interpreted: bool, generated: int | None = None) -> int:
    """The generated cases a parity run of ``spec``'s op draws (what ``list`` and the run's header state):
    ``generated`` when given; else the profile's count, capped by the op under the interpreter
    (``OpSpec.interpreter_generated``)."""
    if generated is not None:
        return generated
    if interpreted and spec.interpreter_generated is not None:
        return min(profile.generated, spec.interpreter_generated)
    return profile.generated


def load_hypothesis_profile(name: str | None = None) -> Profile:
    """Registers every profile as a hypothesis settings profile (hypothesis is imported here, not with the
    module: the CLI's --profile choices need only the names) and loads ``name``'s."""
    from hypothesis import HealthCheck, settings

    for p in PROFILES.values():
        settings.register_profile(p.name, max_examples=p.max_examples, deadline=None, derandomize=True,
                                  database=None, print_blob=True,
                                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    p = current(name)
    settings.load_profile(p.name)
    return p
