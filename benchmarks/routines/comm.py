"""Routine of kiln.comm: fused_allreduce_add_rmsnorm in a world of ONE rank (the harness runs in
one process; the multi-rank all-reduce is tested in tests/ops/comm and, on GPUs, by
tests/cuda/comm_selftest.cu). What it times is the call's fixed cost on one GPU: the copy into
the communicator's buffer, the kernel's barrier with itself and the norm. Backends:

- kiln: fused_allreduce_add_rmsnorm (one //ops:comm kernel on CUDA; the host backend on CPU);
- kiln_unfused: CustomAllReduce.all_reduce + kiln.fused_add_rmsnorm (what the fused kernel must
  beat by at least the norm's own time, the issue's target);
- torch: torch.distributed.all_reduce + residual add + F.rms_norm (what a model writes).

FlashInfer's trtllm_allreduce_fusion needs its own multi-GPU IPC workspace: not run here.
The one-rank group is a gloo group on an in-memory store, made once per process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

import kiln
from kiln.comm import CustomAllReduce

from ..routine import Backend, Routine
from .norm import kiln_version, norm_flops, torch_version

_COMMS: dict[torch.device, CustomAllReduce] = {}


def world_of_one(device: torch.device) -> CustomAllReduce:
    """A one-rank communicator on `device` (and the default one-rank gloo group, if none exists)."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    if dist.get_world_size() != 1:
        raise RuntimeError(
            "benchmarks/routines/comm.py runs in a world of one rank; this process has "
            f"{dist.get_world_size()}"
        )
    comm = _COMMS.get(device)
    if comm is None:
        comm = _COMMS[device] = CustomAllReduce(None, device)
    return comm


def _inputs(inp):
    return inp["x"], inp["residual"], inp["weight"], inp["eps"]


def kiln_fused(inp, ctx):
    x, r, w, eps = _inputs(inp)
    comm = world_of_one(x.device)

    def run():
        kiln.fused_allreduce_add_rmsnorm(x, r, w, eps, comm)
        return x, r

    return run


def kiln_unfused(inp, ctx):
    x, r, w, eps = _inputs(inp)
    comm = world_of_one(x.device)

    def run():
        comm.all_reduce(x, out=x)
        kiln.fused_add_rmsnorm(x, r, w, eps)
        return x, r

    return run


def torch_unfused(inp, ctx):
    x, r, w, eps = _inputs(inp)
    world_of_one(x.device)
    hidden = (x.shape[-1],)

    def run():
        dist.all_reduce(x)
        r.add_(x)
        x.copy_(F.rms_norm(r, hidden, w, eps=eps))
        return x, r

    return run


def torch_available(device: torch.device, dtype: str) -> str | None:
    if device.type == "cuda":
        return "the one-rank group is gloo, whose CUDA all_reduce stages through the host: not a peer"
    return None


FUSED_ALLREDUCE_ADD_RMSNORM = Routine(
    api=kiln.fused_allreduce_add_rmsnorm,
    backends=(
        Backend("kiln", kiln_fused, version=kiln_version),
        Backend("kiln_unfused", kiln_unfused, version=kiln_version),
        Backend("torch", torch_unfused, available=torch_available, version=torch_version),
    ),
    flops_per_call=norm_flops(True),
)

ROUTINES = (FUSED_ALLREDUCE_ADD_RMSNORM,)
