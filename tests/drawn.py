"""A case family's cases as a check gets them, for the project's tests of what the families
draw (tests/suite/test_argument_coverage.py, test_strategy_draws.py): its fixed-seed cases and
``draws`` drawn ones, derandomized (a rerun draws the same), nothing shrunk or stored."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, settings


def family_cases(family, caps: dict, draws: int) -> list:
    """``family``'s fixed-seed cases, then ``draws`` cases of its strategy, in the variant the
    declarations ``caps`` give it."""
    cases = list(family.examples(caps))

    @settings(max_examples=draws, derandomize=True, database=None, deadline=None,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(family.strategy_for(caps))
    def draw(case):
        cases.append(case)

    draw()
    return cases
