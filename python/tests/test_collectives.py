"""Every collective x every dtype x 1, 2, 3 and 4 ranks against numpy references."""

from __future__ import annotations

import pytest
from conftest import job


@pytest.mark.timeout(120)
@pytest.mark.parametrize("nranks", [1, 2, 3, 4])
def test_matrix(nranks: int) -> None:
    out = job(nranks, "import _matrix\n_matrix.Checker(comm).run()\ncomm.destroy()\n", timeout=110)
    checks = [int(o.stdout.split("CHECKS ")[1].split()[0]) for o in out]
    assert all(c > 500 for c in checks), checks
