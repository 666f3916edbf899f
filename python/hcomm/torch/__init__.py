"""The torch.distributed backend ``"hcomm"``.

After ``pip install ./python`` nothing needs importing: torch finds the backend through the
``torch.distributed.backends`` entry point the first time a program names it::

    import torch.distributed as dist
    dist.init_process_group("hcomm")      # in place of "gloo"

On a torch that does not read that entry point group, ``import hcomm.torch`` registers the
backend. The code needs a torch whose ``torch._C._distributed_c10d.Backend`` can be
subclassed in Python with the ``all_gather_single`` / ``reduce_scatter_single`` /
``all_to_all_single`` names (torch 2.15 is what CI tests). See ``docs/torch.md``.
"""

from __future__ import annotations

from ._backend import HcommBackend, failed_ranks, register

__all__ = ["HcommBackend", "failed_ranks", "register"]

register()
