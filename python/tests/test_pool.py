"""hcomm.empty / hcomm.zeros: arrays in the shared-memory pool."""

from __future__ import annotations

import pytest
from conftest import job


@pytest.mark.timeout(60)
def test_pool_arrays() -> None:
    job(
        2,
        """
        import gc, ml_dtypes
        before = comm._info()["pool"]
        a = hcomm.empty((3, 5), np.float32)
        assert a.shape == (3, 5) and a.dtype == np.float32 and a.flags.c_contiguous
        assert a.ctypes.data % 64 == 0
        base = a
        while not isinstance(base, hcomm.PoolMemory):
            base = base.obj if isinstance(base, memoryview) else base.base
        assert base.in_pool and len(base) == 60
        z = hcomm.zeros(7, ml_dtypes.bfloat16)
        assert (z.astype(np.float32) == 0).all()
        a[:] = rank + 1
        comm.allreduce(a)
        assert (a == 3).all()
        used = comm._info()["pool"]
        assert used["hits"] >= before["hits"] + 2 and used["bytes_in_use"] > 0
        v = a[1:]          # a view keeps the memory
        del a, base
        gc.collect()
        assert comm._info()["pool"]["bytes_in_use"] > 0 and (v == 3).all()
        del v, z
        gc.collect()
        assert comm._info()["pool"]["bytes_in_use"] == 0, comm._info()["pool"]
        e = hcomm.empty(0, np.int8)
        assert e.size == 0
        comm.destroy()
        """,
    )


@pytest.mark.timeout(120)
def test_large_pool_arrays_with_default_settings() -> None:
    # 256 MiB, beyond the 64 MiB ordinary block: still pool memory (a block of its own),
    # and the all-reduce on it is right (the job's environment has no HCOMM_* settings).
    job(
        2,
        """
        import gc
        a = hcomm.empty(64 << 20, np.float32)
        base = a
        while not isinstance(base, hcomm.PoolMemory):
            base = base.obj if isinstance(base, memoryview) else base.base
        assert base.in_pool, comm._info()["pool"]
        a[:] = rank + 1
        a[::4096] = 7 * (rank + 1)
        comm.allreduce(a)
        assert (a[1::4096] == 3).all() and (a[::4096] == 21).all()
        del a, base
        gc.collect()
        assert comm._info()["pool"]["bytes_in_use"] == 0, comm._info()["pool"]
        comm.destroy()
        """,
        timeout=100,
    )
