"""Every scenario x policy gives the summary recorded before the engine was rewritten (bit for
bit; see ``tests/golden/summaries.py``)."""

import pytest
from golden.summaries import load, run_one

GOLDEN = load()
CASES = [(sc, pol) for sc in sorted(GOLDEN) for pol in sorted(GOLDEN[sc])]


@pytest.mark.parametrize(("scenario", "policy"), CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_summary_matches_golden(scenario: str, policy: str) -> None:
    want = GOLDEN[scenario][policy]
    got = run_one(scenario, policy)
    diff = {k: (want.get(k), got.get(k)) for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k)}
    assert not diff, f"{scenario} x {policy}: (recorded, now) differ: {diff}"

