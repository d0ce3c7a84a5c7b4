"""What each rank of tests/ops/comm/test_comm.py runs, in its own process (torch.multiprocessing spawn:
the functions must be importable by name, so they live here and not in the test module).

Each rank joins a gloo group through a file rendezvous (no ports), runs many cases in one process
(spawning costs seconds on a 2-core CI machine) and raises AssertionError on a failure, which the
spawning test reports with the rank's traceback.
"""

from __future__ import annotations

import logging
import os
import time

import torch
import torch.distributed as dist

# NVLink multicast stays off in every process the tests start (the device machines require it).
MULTICAST_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
MAX_SIZE = 4096  # bytes: small, so max_size and max_size + 1 cases stay cheap


def _init(rank: int, world: int, init_file: str) -> None:
    os.environ.update(MULTICAST_OFF)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)


def _ints(numel: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Integer values in [-8, 8] (never all zero): their sums over <= 8 ranks are exact in every dtype."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(-8, 9, (numel,), generator=g).to(dtype)
    t[0] = 1 + seed % 7  # at least one non-zero element
    return t


def _torch_all_reduce(x: torch.Tensor) -> torch.Tensor:
    ref = x.clone()
    dist.all_reduce(ref)
    return ref


def _same_on_every_rank(t: torch.Tensor, world: int) -> None:
    gathered = [None] * world
    dist.all_gather_object(
        gathered,
        t.view(-1)
        .view(torch.uint8 if t.element_size() == 1 else torch.int16 if t.element_size() == 2 else torch.int32)
        .tolist(),
    )
    assert all(g == gathered[0] for g in gathered), "ranks got different bits"


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def suite(rank: int, world: int, init_file: str) -> None:
    """Every CPU case of the host backend at one world size."""
    _init(rank, world, init_file)
    import pytest

    import kiln
    from kiln.comm import CustomAllReduce, fused_allreduce_add_rmsnorm

    records = _Records()
    logging.getLogger("kiln.comm").addHandler(records)
    comm = CustomAllReduce(None, "cpu", max_size=MAX_SIZE, timeout=30)
    assert kiln.CustomAllReduce is CustomAllReduce

    # Exact against torch.distributed.all_reduce: every dtype, 1 element to max_size, odd sizes,
    # and the fallback above max_size.
    for dtype in DTYPES:
        limit = MAX_SIZE // torch.tensor([], dtype=dtype).element_size()
        for numel in (1, 3, 37, 1001, limit - 1, limit, limit + 1, 3 * limit + 5):
            x = _ints(numel, dtype, seed=1000 * rank + numel)
            got = comm.all_reduce(x)
            ref = _torch_all_reduce(x)
            assert got.dtype == dtype and got.shape == x.shape
            assert torch.equal(got, ref), f"{dtype} numel={numel}: {got[:8]} != {ref[:8]}"
            _same_on_every_rank(got, world)
    # The fallback logs once, not per call (two sizes above max_size per dtype went there).
    fallbacks = [m for m in records.messages if "max_size" in m]
    assert len(fallbacks) == 1, records.messages
    assert f"max_size={MAX_SIZE} bytes" in fallbacks[0]

    # Shapes, out=, in place, non-contiguous input (copied into the buffer).
    x = _ints(5 * 7, torch.float32, seed=rank).view(5, 7)
    ref = _torch_all_reduce(x)
    out = torch.full_like(x, float("nan"))
    assert comm.all_reduce(x, out=out) is out and torch.equal(out, ref)
    y = x.clone()
    assert comm.all_reduce(y, out=y) is y and torch.equal(y, ref)
    assert torch.equal(comm.all_reduce(x.t()), ref.t())  # a transposed view
    wide = _ints(6 * 9, torch.bfloat16, seed=rank + 7).view(6, 9)
    assert torch.equal(comm.all_reduce(wide[:, 1:8:2]), _torch_all_reduce(wide)[:, 1:8:2])
    scalar = torch.tensor(float(rank + 1))
    assert comm.all_reduce(scalar).item() == world * (world + 1) / 2
    assert comm.all_reduce(torch.empty(0, 4)).shape == (0, 4)

    # Random (non-integer) float32 data: the float64 sum within float32 rounding, and the same bits
    # on every rank and on every run (the fixed rank order).
    g = torch.Generator().manual_seed(rank + 100)
    r = torch.randn(997, generator=g)
    all_r = [torch.empty_like(r) for _ in range(world)]
    dist.all_gather(all_r, r)
    want = torch.stack(all_r).double().sum(0)
    first = comm.all_reduce(r)
    torch.testing.assert_close(first.double(), want, rtol=1e-6, atol=1e-6)
    _same_on_every_rank(first, world)
    assert torch.equal(comm.all_reduce(r), first), "not deterministic run to run"

    # The fused variant against all_reduce + kiln.fused_add_rmsnorm, and the float64 definition.
    for dtype, tokens, hidden in ((torch.float32, 3, 40), (torch.bfloat16, 5, 33)):
        g = torch.Generator().manual_seed(rank * 31 + hidden)
        x = torch.randn(tokens, hidden, generator=g).to(dtype)
        residual = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(hidden)).to(dtype)
        weight = torch.randn(hidden, generator=torch.Generator().manual_seed(hidden + 1)).to(dtype)
        x_ref, res_ref = _torch_all_reduce(x), residual.clone()
        all_x = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(all_x, x)
        res64 = residual.double() + torch.stack(all_x).double().sum(0)
        norm64 = res64 * torch.rsqrt(res64.pow(2).mean(-1, keepdim=True) + 1e-6) * weight.double()
        kiln.fused_add_rmsnorm(x_ref, res_ref, weight, 1e-6)
        fused_allreduce_add_rmsnorm(x, residual, weight, 1e-6, comm)
        tol = {torch.float32: 1e-5, torch.bfloat16: 3e-2}[dtype]
        torch.testing.assert_close(residual.double(), res64, rtol=tol, atol=tol)
        torch.testing.assert_close(x.double(), norm64, rtol=tol, atol=tol * 4)
        # The unfused sequence with gloo's sum: float32 only, as gloo adds bfloat16 in bfloat16
        # (a rounding per rank) where kiln adds in float32 and rounds once.
        if dtype == torch.float32:
            torch.testing.assert_close(residual, res_ref, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(x, x_ref, rtol=1e-5, atol=1e-5)
        _same_on_every_rank(x, world)

    # torch.compile(fullgraph=True) traces through the custom ops kiln::comm_all_reduce and
    # kiln::comm_fused_allreduce_add_rmsnorm (aot_eager: functionalised, no code generated); the
    # compiled layer gives the eager layer's bits. Once, at 2 ranks: compiling costs seconds.
    if world == 2:

        def layer(x, residual, weight):
            y = comm.all_reduce(x * 2)
            y = comm.all_reduce(y, out=y)  # in place
            fused_allreduce_add_rmsnorm(y, residual, weight, 1e-6, comm)
            return y + 1

        x = _ints(4 * 16, torch.float32, seed=rank + 5).view(4, 16)
        residual = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
        weight = torch.randn(16, generator=torch.Generator().manual_seed(4))
        compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
        res_c, res_e = residual.clone(), residual.clone()
        got, want = compiled(x, res_c, weight), layer(x, res_e, weight)
        assert torch.equal(got, want) and torch.equal(res_c, res_e), "compiled layer differs from eager"
        torch._dynamo.reset()

    # Bad inputs, each with a message naming the argument.
    with pytest.raises(TypeError, match=r"x.dtype must be one of float32, float16, bfloat16, got int32"):
        comm.all_reduce(torch.ones(4, dtype=torch.int32))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        comm.all_reduce([1.0])
    with pytest.raises(ValueError, match=r"out must be contiguous"):
        comm.all_reduce(torch.ones(4, 4), out=torch.empty(4, 4).t())
    with pytest.raises(ValueError, match=r"out must have x's shape"):
        comm.all_reduce(torch.ones(4), out=torch.empty(5))
    with pytest.raises(ValueError, match=r"weight must be \[8\]"):
        fused_allreduce_add_rmsnorm(torch.ones(2, 8), torch.ones(2, 8), torch.ones(7), 1e-6, comm)
    with pytest.raises(ValueError, match=r"max_size must be an int of at least 1"):
        CustomAllReduce(None, "cpu", max_size=0)
    # Sizes that differ across ranks: every rank raises, naming each rank's size; the next
    # collective still works.
    with pytest.raises(ValueError, match=r"every rank must pass the same number of elements.*rank 1: 4"):
        comm.all_reduce(torch.ones(3 + rank))
    assert torch.equal(comm.all_reduce(torch.ones(3)), torch.full((3,), float(world)))

    # The default max_size (8 MiB) takes a 4 MiB bf16 message on the custom path.
    with CustomAllReduce(None, "cpu", timeout=30) as big:
        assert big.max_size == 8 << 20
        x = _ints(2 << 20, torch.bfloat16, seed=rank)
        with big.capture():
            assert torch.equal(big.all_reduce(x), _torch_all_reduce(x))
    with pytest.raises(RuntimeError, match="this CustomAllReduce is closed"):
        big.all_reduce(x)

    # A peer that closes its communicator: the others fail at once, naming it.
    with CustomAllReduce(None, "cpu", max_size=MAX_SIZE, timeout=30) as third:
        if rank == world - 1:
            third.close()
        else:
            with pytest.raises(RuntimeError, match=rf"rank\(s\) \[{world - 1}\] closed their communicator"):
                third.all_reduce(torch.ones(3))
    dist.barrier()

    comm.close()
    comm.close()  # idempotent
    with pytest.raises(RuntimeError, match="this CustomAllReduce is closed"):
        comm.all_reduce(torch.ones(3))
    dist.barrier()
    dist.destroy_process_group()


def properties(rank: int, world: int, init_file: str) -> None:
    """Hypothesis properties of the host backend, every rank drawing the same examples
    (derandomized, no example database: the ranks must call their collectives in step): for any
    shape, dtype and max_size, all_reduce equals torch.distributed.all_reduce exactly on
    integer-valued inputs (the custom path, or the fallback above max_size), and the result is the
    same on every rank. A failing example fails on every rank (the same comparison)."""
    _init(rank, world, init_file)
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from kiln.comm import CustomAllReduce

    comms = {size: CustomAllReduce(None, "cpu", max_size=size, timeout=30) for size in (64, 1000, MAX_SIZE)}

    @settings(
        max_examples=40,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(
        shape=st.lists(st.integers(0, 40), min_size=0, max_size=3),
        dtype=st.sampled_from(DTYPES),
        size=st.sampled_from(sorted(comms)),
        transpose=st.booleans(),
        seed=st.integers(0, 1 << 20),
    )
    def check(shape, dtype, size, transpose, seed):
        numel = 1
        for d in shape:
            numel *= d
        x = _ints(max(numel, 1), dtype, seed=seed + 7919 * rank)[:numel].view(shape)
        if transpose and x.dim() >= 2:
            x = x.transpose(0, 1)  # a non-contiguous input
        got = comms[size].all_reduce(x)
        ref = _torch_all_reduce(x.contiguous())
        assert got.shape == x.shape and got.dtype == dtype
        assert torch.equal(got, ref), f"shape {shape} {dtype} max_size {size}"
        _same_on_every_rank(got, world)

    check()
    for comm in comms.values():
        comm.close()
    dist.barrier()
    dist.destroy_process_group()


def dying_rank(rank: int, world: int, init_file: str, results) -> None:
    """The last rank exits after one collective, mid-way through the second one's calls; the others
    must raise a TimeoutError naming it within their timeout. Reports (rank, outcome) to `results`."""
    _init(rank, world, init_file)
    from kiln.comm import CustomAllReduce

    comm = CustomAllReduce(None, "cpu", max_size=MAX_SIZE, timeout=2)
    comm.all_reduce(torch.ones(8))
    if rank == world - 1:
        os._exit(3)  # dies without closing anything, like a crash
    start = time.monotonic()
    try:
        comm.all_reduce(torch.ones(8))
        results.put((rank, "returned"))
    except TimeoutError as e:
        results.put((rank, f"TimeoutError after {time.monotonic() - start:.1f} s: {e}"))
    try:
        comm.all_reduce(torch.ones(8))
    except RuntimeError as e:
        results.put((rank, f"then RuntimeError: {e}"))
    comm.close()
    os._exit(0)  # the group's peer is gone: skip destroy_process_group's handshake


def cuda_two_ranks_one_gpu(rank: int, world: int, init_file: str) -> None:
    """Two ranks on one GPU (gloo for the group and the handle exchange: NCCL refuses two ranks on
    one device): kiln's kernels through the IPC-mapped buffers, exact against gloo's sum for every
    dtype, the fallback above max_size, the fused kernel against all_reduce + kiln.fused_add_rmsnorm,
    and CUDA-graph replays."""
    _init(rank, world, init_file)
    import kiln
    from kiln.comm import CustomAllReduce, fused_allreduce_add_rmsnorm

    records = _Records()
    logging.getLogger("kiln.comm").addHandler(records)
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    comm = CustomAllReduce(None, device, max_size=1 << 20, timeout=60)
    assert comm._cuda is not None, records.messages  # noqa: SLF001 (the custom path is in use)
    for dtype in DTYPES:
        limit = (1 << 20) // torch.tensor([], dtype=dtype).element_size()
        for numel in (1, 7, 1001, 4096, limit, limit + 1):
            x = _ints(numel, dtype, seed=rank * 7 + numel)
            want = x.clone()
            dist.all_reduce(want)  # gloo on the CPU copy: the reference
            got = comm.all_reduce(x.to(device))
            assert torch.equal(got.cpu(), want), f"{dtype} numel={numel}"
            _same_on_every_rank(got.cpu(), world)
    assert len([m for m in records.messages if "max_size" in m]) == 1, records.messages
    # Strided input is copied; out= in place.
    x = _ints(8 * 6, torch.bfloat16, seed=rank).view(8, 6).to(device)
    want = x.cpu().clone()
    dist.all_reduce(want)
    assert torch.equal(comm.all_reduce(x.t()).cpu(), want.t())
    assert torch.equal(comm.all_reduce(x, out=x).cpu(), want)

    # The fused kernel against all_reduce + kiln.fused_add_rmsnorm: the residual bit-exact, x
    # within the norm's tolerance (the two norms sum the squares in other orders).
    for dtype, tokens, hidden in (
        (torch.bfloat16, 1, 8192),
        (torch.bfloat16, 128, 8192),
        (torch.float32, 5, 33),
    ):
        g = torch.Generator().manual_seed(rank * 31 + tokens)
        x = torch.randn(tokens, hidden, generator=g).to(dtype).to(device)
        residual = (
            torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(5)).to(dtype).to(device)
        )
        weight = torch.randn(hidden, generator=torch.Generator().manual_seed(6)).to(dtype).to(device)
        x_ref, res_ref = comm.all_reduce(x), residual.clone()
        kiln.fused_add_rmsnorm(x_ref, res_ref, weight, 1e-6)
        fused_allreduce_add_rmsnorm(x, residual, weight, 1e-6, comm)
        assert torch.equal(residual, res_ref), f"fused residual {dtype} {tokens}x{hidden}"
        tol = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}[dtype]
        torch.testing.assert_close(x, x_ref, rtol=tol, atol=tol)
        _same_on_every_rank(x.cpu(), world)

    # CUDA graphs: one all_reduce captured, replayed on fresh inputs copied into its input.
    static_x = torch.zeros(3000, dtype=torch.bfloat16, device=device)
    static_out = torch.empty_like(static_x)
    comm.all_reduce(static_x, out=static_out)  # warm: the module is loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with comm.capture(), torch.cuda.graph(graph):
        comm.all_reduce(static_x, out=static_out)
    for replay in range(3):
        x = _ints(3000, torch.bfloat16, seed=100 * replay + rank)
        want = x.clone()
        dist.all_reduce(want)
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out.cpu(), want), f"graph replay {replay}"
    comm.close()
    dist.barrier()
    dist.destroy_process_group()
