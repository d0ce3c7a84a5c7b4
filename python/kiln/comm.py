"""Communication for tensor parallelism (docs/comm.md): an all-reduce of kiln's own on a
torch.distributed process group, and the all-reduce + residual add + RMSNorm that serving engines
call between layers.

    comm = CustomAllReduce(group, device, max_size=8 << 20)   # once per group, after init_process_group
    y = comm.all_reduce(x, out=None)                          # y = sum over ranks of x
    fused_allreduce_add_rmsnorm(x, residual, weight, eps, comm)
        # residual += all_reduce(x); x = rmsnorm(residual) * weight   (in place)

x: any shape, float32/float16/bfloat16, any strides (it is copied into the communicator's buffer,
so a non-contiguous x works); out: x's shape and dtype, contiguous. Every rank passes the same
shape and dtype. The sum runs in float32 in rank order 0, 1, ..., world - 1 and is rounded once to
x's dtype, so every rank gets bit-identical results and a run gives the same bits every time.

Backends. CPU tensors (device "cpu") use the host backend: one POSIX shared-memory segment per
rank (a header of flags and the data buffer of max_size bytes), the segment names exchanged through
the group (which must carry CPU objects: gloo), a barrier on the flags, the reduction in torch ops.
It makes the whole path (group, buffers, barrier, fallback, errors, timeouts) testable without a
GPU. CUDA tensors use //ops:comm's kernels (one-shot, two-shot, fused) over buffers shared as CUDA
IPC handles exchanged through the group; they have run on no multi-GPU machine yet (docs/comm.md).

Fallback. A message of more than max_size bytes, or a communicator whose custom path is not
available, goes to torch.distributed.all_reduce on the group; the first fallback of each reason
is logged once per communicator on the 'kiln.comm' logger.

Failure. Every wait is bounded: a rank that dies mid-collective (or never calls it) makes the others
raise a TimeoutError naming it after `timeout` seconds (default KILN_COMM_TIMEOUT). A communicator
that timed out is broken: later calls raise until it is closed and made again.

Compiled graphs. all_reduce and fused_allreduce_add_rmsnorm are the torch custom ops
kiln::comm_all_reduce and kiln::comm_fused_allreduce_add_rmsnorm while torch.compile traces, so
torch.compile(fullgraph=True) takes a layer that calls them; a custom op takes no Python object,
so the op carries the communicator's handle (an int) and looks it up when it runs.

Memory ordering: the host backend's flags and data are plain stores and loads through torch; a
rank writes its data before its flag and reads peers' flags before their data, which x86-64's
total store order keeps in order. Other hosts are untested.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
import uuid
import weakref
from multiprocessing import resource_tracker, shared_memory

import torch
import torch.distributed as dist

from . import _jit
from ._ops import custom_op
from .api_logging import logged_api
from .runtime import env
from .trace import comm as comm_traces
from .trace import traced

log = logging.getLogger("kiln.comm")

LABEL = "//ops:comm"
_NAMES = {"dtype": "x.dtype"}
# One-shot up to this many bytes, two-shot from it (with more than 2 ranks: with 2 both move the
# same bytes). Provisional: the issue asks for the switch point measured on 2+ GPUs, and none was
# lent (docs/perf/comm.md).
_TWO_SHOT_FROM = 512 << 10
# Flag polls a second, to turn timeout into the kernels' spin_limit (a poll of a flag in a peer's
# memory takes ~0.5-1 us; the limit is approximate, not a clock).
_POLLS_PER_SECOND = 1_000_000

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPE_CODE = {torch.float32: 1, torch.float16: 2, torch.bfloat16: 3}
_CODE_NAME = {1: "float32", 2: "float16", 3: "bfloat16"}

# The header of each rank's segment: int64 slots, then the data buffer at _DATA_OFFSET (a multiple
# of 128 bytes, so the data is aligned for every dtype and the flags share no cache line with it).
_ARRIVE, _DONE, _NUMEL, _DTYPE, _CLOSED = range(5)
_HEADER_SLOTS = 16
_DATA_OFFSET = 128
# Spins before the waiting loop starts to sleep, and the sleep then (seconds). Ranks on a shared
# CPU (CI runs 4 on 2 cores) must yield, or the rank being waited for never runs.
_SPINS = 200
_SLEEP = 50e-6


def _is_tensor(api: str, name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{api}: {name} must be a torch.Tensor, got {type(t).__name__}")


def _check_dtype(api: str, name: str, t: torch.Tensor) -> None:
    if t.dtype not in DTYPES:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in DTYPES)
        raise TypeError(
            f"{api}: {name}.dtype must be one of {allowed}, got {str(t.dtype).removeprefix('torch.')}"
        )


# Open communicators by handle, for the custom ops (weak: a communicator nobody holds may go).
_by_handle: dict[int, weakref.ref] = {}
_handles = itertools.count(1)


def _communicator(handle: int, api: str) -> CustomAllReduce:
    comm = _by_handle.get(handle)
    comm = comm() if comm is not None else None
    if comm is None:
        raise RuntimeError(f"{api}: communicator {handle} is closed or gone (a compiled graph outlived it)")
    return comm


class CustomAllReduce:
    """kiln's all-reduce (sum) over the ranks of one process group on one machine.

    Args:
        group: the torch.distributed process group (None: the default group). The host backend
            exchanges its segment names through it, so it must carry CPU objects (gloo).
        device: where the tensors live; ``"cpu"`` selects the host backend. Default: cpu.
        max_size: the largest message in bytes the custom path takes (its buffer size); larger
            ones fall back to ``torch.distributed.all_reduce``. At least 1.
        timeout: seconds a wait for the other ranks may take before a ``TimeoutError``; default
            the ``KILN_COMM_TIMEOUT`` setting.

    Collective: every rank of the group makes it, in the same order as its other collectives.
    """

    def __init__(self, group=None, device=None, max_size: int = 8 << 20, *, timeout: float | None = None):
        api = "kiln.comm.CustomAllReduce"
        if not dist.is_initialized():
            raise RuntimeError(f"{api}: torch.distributed is not initialised; call init_process_group first")
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"{api}: max_size must be an int of at least 1 (bytes), got {max_size!r}")
        if timeout is None:
            timeout = float(env.get("KILN_COMM_TIMEOUT"))
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"{api}: timeout must be a number of seconds > 0, got {timeout!r}")
        self.group = group
        self.device = torch.device("cpu" if device is None else device)
        self.max_size = max_size
        self.timeout = float(timeout)
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._seq = 0  # collectives through the custom path so far (identical on every rank)
        self._closed = False
        self._broken: str | None = None
        self._logged: set[str] = set()
        self._segments: list[shared_memory.SharedMemory] = []
        self._headers: list[torch.Tensor] = []
        self._unavailable: str | None = None
        self._cuda: dict | None = None  # the CUDA path's buffers, once opened
        self.handle = next(_handles)  # what the custom ops carry (compiled graphs)
        _by_handle[self.handle] = weakref.ref(self)
        if self.device.type == "cpu":
            self._open_host_buffers()
        elif self.device.type == "cuda":
            self._open_cuda_buffers()
        else:
            self._unavailable = f"no custom path on {self.device.type}; using torch.distributed.all_reduce"

    # --- the host backend's buffers ---------------------------------------------------------

    def _open_host_buffers(self) -> None:
        size = _DATA_OFFSET + self.max_size
        mine = shared_memory.SharedMemory(name=f"kiln_comm_{uuid.uuid4().hex[:16]}", create=True, size=size)
        # Python < 3.13 registers every segment a process creates or attaches with its resource
        # tracker, which spawned ranks share, and unlinks at exit what stays registered. Each rank
        # unregisters at once (its own segment before the names are exchanged, so no peer's
        # registration can interleave) and unlinks its own explicitly once every rank attached.
        resource_tracker.unregister(mine._name, "shared_memory")  # noqa: SLF001
        try:
            torch.frombuffer(mine.buf, dtype=torch.int64, count=_HEADER_SLOTS).zero_()
            names: list[str | None] = [None] * self.world_size
            dist.all_gather_object(names, mine.name, group=self.group)
            for r, name in enumerate(names):
                if r == self.rank:
                    seg = mine
                else:
                    seg = shared_memory.SharedMemory(name=name)
                    resource_tracker.unregister(seg._name, "shared_memory")  # noqa: SLF001
                self._segments.append(seg)
                self._headers.append(torch.frombuffer(seg.buf, dtype=torch.int64, count=_HEADER_SLOTS))
            # Everyone has attached every segment: unlink ours now, so nothing is left in /dev/shm
            # whatever happens to the processes later (the mappings stay valid until closed).
            dist.barrier(group=self.group)
        finally:
            resource_tracker.register(mine._name, "shared_memory")  # noqa: SLF001 (unlink unregisters it)
            mine.unlink()

    def _data(self, r: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.frombuffer(self._segments[r].buf, dtype=dtype, count=numel, offset=_DATA_OFFSET)

    def _wait(self, slot: int, value: int, what: str) -> None:
        """Wait until every rank's header[slot] >= value, for at most self.timeout seconds."""
        deadline = time.monotonic() + self.timeout
        spins = 0
        pending = [r for r in range(self.world_size) if r != self.rank]
        while pending:
            pending = [r for r in pending if int(self._headers[r][slot]) < value]
            # A peer sets its flag before it closes: read the flag again after seeing it closed,
            # or a peer that finished this very call and then closed would read as a failure.
            closed = [
                r for r in pending if int(self._headers[r][_CLOSED]) and int(self._headers[r][slot]) < value
            ]
            if closed:
                self._broken = f"rank(s) {closed} closed their communicator during all_reduce #{value}"
                raise RuntimeError(f"kiln.comm: rank {self.rank}: {self._broken}")
            if not pending:
                return
            if time.monotonic() > deadline:
                self._broken = (
                    f"rank {self.rank} waited {self.timeout:g} s for rank(s) {pending} to {what} "
                    f"all_reduce #{value}"
                )
                raise TimeoutError(
                    f"kiln.comm: {self._broken} (timeout=, KILN_COMM_TIMEOUT); a rank died or did not make "
                    "the same collective calls. This communicator is broken: close it and make a new one."
                )
            spins += 1
            if spins > _SPINS:
                time.sleep(_SLEEP)

    def _host_all_reduce(self, x: torch.Tensor, out: torch.Tensor) -> None:
        numel, dtype = x.numel(), x.dtype
        self._seq += 1
        seq = self._seq
        me = self._headers[self.rank]
        self._data(self.rank, numel, dtype).view(x.shape).copy_(x)  # any strides
        me[_NUMEL] = numel
        me[_DTYPE] = _DTYPE_CODE[dtype]
        me[_ARRIVE] = seq  # last: the data and its size are in place
        self._wait(_ARRIVE, seq, "arrive at")
        sizes = [(int(h[_NUMEL]), int(h[_DTYPE])) for h in self._headers]
        if len(set(sizes)) != 1:
            me[_DONE] = seq  # every rank read the sizes before any writes the next round's
            self._wait(_DONE, seq, "finish")
            desc = ", ".join(f"rank {r}: {n} {_CODE_NAME.get(c, c)}" for r, (n, c) in enumerate(sizes))
            raise ValueError(
                f"kiln.comm all_reduce #{seq}: every rank must pass the same number of elements "
                f"and dtype, got {desc}"
            )
        # Fixed order: rank 0, 1, ... in float32, one rounding at the end; the same bits everywhere.
        acc = self._data(0, numel, dtype).to(torch.float32, copy=True)
        for r in range(1, self.world_size):
            acc += self._data(r, numel, dtype)
        out.copy_(acc.view(x.shape))
        me[_DONE] = seq  # we are done reading the peers' buffers
        self._wait(_DONE, seq, "finish")  # nobody overwrites a buffer another rank still reads

    # --- the CUDA backend (//ops:comm) -----------------------------------------------------

    def _module(self, dtype: torch.dtype):
        return _jit.module(LABEL, self.device, "kiln.comm.CustomAllReduce", dtype=dtype, names=_NAMES)

    def _open_cuda_buffers(self) -> None:
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        # Every rank's GPU by UUID (ordinals differ between processes with CUDA_VISIBLE_DEVICES).
        uuids: list = [None] * self.world_size
        dist.all_gather_object(uuids, str(torch.cuda.get_device_properties(index).uuid), group=self.group)
        local = {str(torch.cuda.get_device_properties(i).uuid): i for i in range(torch.cuda.device_count())}
        mod = self._module(torch.bfloat16)  # every dtype's module has the buffer helpers
        why = None
        if self.world_size > mod.max_ranks:
            why = f"world size {self.world_size} is over the kernels' {mod.max_ranks} ranks"
        for r, uuid_ in enumerate(uuids):
            if why is None and uuid_ not in local:
                why = (
                    f"rank {r}'s GPU ({uuid_}) is not visible in rank {self.rank}'s process "
                    "(CUDA_VISIBLE_DEVICES)"
                )
            elif why is None:
                ok, reason = mod.can_access_peer(device=index, peer=local[uuid_])
                if not ok:
                    why = f"rank {self.rank} cannot reach rank {r}'s GPU: {reason}"
        # The path must be the same on every rank: one rank's reason disables it everywhere.
        reasons: list = [None] * self.world_size
        dist.all_gather_object(reasons, why, group=self.group)
        found = [f"{r}: {w}" for r, w in enumerate(reasons) if w]
        if found:
            self._unavailable = (
                f"kiln's CUDA all-reduce is unavailable ({'; '.join(found)}); using torch.distributed"
            )
            return
        data = mod.alloc_buffer(bytes=self.max_size, device=index)
        signals = mod.alloc_buffer(bytes=mod.signal_bytes, device=index)
        error = mod.alloc_buffer(bytes=64, device=index)
        handles: list = [None] * self.world_size
        mine = (mod.ipc_handle(ptr=data, device=index), mod.ipc_handle(ptr=signals, device=index))
        dist.all_gather_object(handles, mine, group=self.group)
        cuda = {
            "data": [],
            "signals": [],
            "error": error,
            "own": (data, signals, error),
            "index": index,
            "mod": mod,
        }
        for r, (h_data, h_signals) in enumerate(handles):
            if r == self.rank:
                cuda["data"].append(data)
                cuda["signals"].append(signals)
            else:
                cuda["data"].append(mod.ipc_open(handle=h_data, device=index))
                cuda["signals"].append(mod.ipc_open(handle=h_signals, device=index))
        self._cuda = cuda
        dist.barrier(group=self.group)

    def _spin_limit(self) -> int:
        return max(1, int(self.timeout * _POLLS_PER_SECOND))

    def _check_device_error(self, mod, stream: int) -> None:
        if torch.cuda.is_current_stream_capturing():
            return  # read by the next eager call: the word stays set until read
        value = mod.read_and_clear_error(error=self._cuda["error"], device=self._cuda["index"], stream=stream)
        if value:
            self._broken = (
                f"rank {self.rank}'s kernel gave up waiting for a peer after about {self.timeout:g} s"
            )
            raise TimeoutError(
                f"kiln.comm: {self._broken} (timeout=, KILN_COMM_TIMEOUT); a rank died or did not make the "
                "same collective calls. This communicator is broken: close it and make a new one."
            )

    def _cuda_all_reduce(self, x: torch.Tensor, out: torch.Tensor) -> None:
        c = self._cuda
        mod = self._module(x.dtype)
        stream = _jit.stream_of(self.device)
        src = x if x.is_contiguous() else x.contiguous()
        mod.copy_to_buffer(dst=c["data"][self.rank], src=_jit.dl(src), stream=stream)
        nbytes = x.numel() * x.element_size()
        algo = mod.algos["two_shot" if nbytes >= _TWO_SHOT_FROM and self.world_size > 2 else "one_shot"]
        mod.all_reduce(
            data=c["data"],
            signals=c["signals"],
            out=_jit.dl(out),
            rank=self.rank,
            world_size=self.world_size,
            spin_limit=self._spin_limit(),
            error=c["error"],
            algo=algo,
            stream=stream,
        )
        self._check_device_error(mod, stream)

    def _cuda_fused(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        c = self._cuda
        mod = self._module(x.dtype)
        stream = _jit.stream_of(self.device)
        mod.copy_to_buffer(dst=c["data"][self.rank], src=_jit.dl(x), stream=stream)
        mod.fused_allreduce_add_rmsnorm(
            data=c["data"],
            signals=c["signals"],
            out=_jit.dl(x),
            residual=_jit.dl(residual),
            weight=_jit.dl(weight),
            rank=self.rank,
            world_size=self.world_size,
            spin_limit=self._spin_limit(),
            error=c["error"],
            eps=float(eps),
            stream=stream,
        )
        self._check_device_error(mod, stream)

    def _close_cuda(self) -> None:
        c, self._cuda = self._cuda, None
        mod, index = c["mod"], c["index"]
        torch.cuda.synchronize(index)
        for r in range(self.world_size):
            if r != self.rank:
                mod.ipc_close(ptr=c["data"][r], device=index)
                mod.ipc_close(ptr=c["signals"][r], device=index)
        for ptr in c["own"]:
            mod.free_buffer(ptr=ptr, device=index)

    # --- the public methods -----------------------------------------------------------------

    def _check_open(self, api: str) -> None:
        if self._closed:
            raise RuntimeError(f"{api}: this CustomAllReduce is closed")
        if self._broken is not None:
            raise RuntimeError(
                f"{api}: this CustomAllReduce is broken ({self._broken}); close it and make a new one"
            )

    def _fallback(self, why: str, reason: str, x: torch.Tensor, out: torch.Tensor) -> None:
        if why not in self._logged:  # once per communicator and kind of reason
            self._logged.add(why)
            log.warning("kiln.comm rank %d: %s", self.rank, reason)
        if out.data_ptr() != x.data_ptr() or out.stride() != x.stride():
            out.copy_(x)
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.group)

    @logged_api("kiln.comm.CustomAllReduce.all_reduce", mutates=("out",))
    def all_reduce(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``out = sum over the group's ranks of x`` (collective).

        Args:
            x: float32, float16 or bfloat16 on this communicator's device, any shape and strides;
                the same shape and dtype on every rank.
            out: optional contiguous tensor of x's shape and dtype (may be x itself).

        Returns:
            ``out`` (a new tensor when not given). Messages over ``max_size`` bytes go to
            ``torch.distributed.all_reduce`` (logged once).
        """
        api = "kiln.comm.CustomAllReduce.all_reduce"
        self._check_open(api)
        _is_tensor(api, "x", x)
        _check_dtype(api, "x", x)
        if x.device != self.device:
            raise ValueError(f"{api}: x is on {x.device}, this communicator on {self.device}")
        if out is None:
            out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        else:
            _is_tensor(api, "out", out)
            if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
                raise ValueError(
                    f"{api}: out must have x's shape, dtype and device ({list(x.shape)}, "
                    f"{x.dtype}, {x.device}), got ({list(out.shape)}, {out.dtype}, {out.device})"
                )
            if not out.is_contiguous():
                raise ValueError(
                    f"{api}: out must be contiguous (strides {list(out.stride())} of shape "
                    f"{list(out.shape)}); pass out=None or a contiguous tensor"
                )
        if torch.compiler.is_compiling():  # an op's mutated argument may not alias an input
            _all_reduce_op.op(self.handle, x.clone() if out is x else x, out)
            return out
        self._all_reduce_into(x, out)
        return out

    def _all_reduce_into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """all_reduce after its checks: the eager call, and kiln::comm_all_reduce's body."""
        nbytes = x.numel() * x.element_size()
        if self._unavailable is not None:
            self._fallback("unavailable", self._unavailable, x, out)
        elif nbytes > self.max_size:
            self._fallback(
                "max_size",
                f"messages over max_size={self.max_size} bytes (this one: {nbytes}) use "
                "torch.distributed.all_reduce",
                x,
                out,
            )
        elif x.numel() == 0:
            pass
        elif self._cuda is not None:
            self._cuda_all_reduce(x, out)
        else:
            self._host_all_reduce(x, out)

    @contextlib.contextmanager
    def capture(self):
        """A context for CUDA-graph capture. The buffers are fixed and every call copies its input
        into them, so a captured call replays as it was captured (the copy included) and nothing
        needs registering; the kernels keep their barrier epochs in device memory, so replays are
        new calls. Errors of captured calls are raised by the next eager call. On CPU it does
        nothing; it exists so the same code runs on both backends."""
        self._check_open("kiln.comm.CustomAllReduce.capture")
        yield self

    def close(self) -> None:
        """Release the buffers (not collective; idempotent). Peers waiting on this rank in a
        collective fail at once with an error saying it closed."""
        if self._closed:
            return
        self._closed = True
        _by_handle.pop(self.handle, None)
        if self._cuda is not None:
            self._close_cuda()
        if self._headers:
            self._headers[self.rank][_CLOSED] = 1
        self._headers.clear()
        for seg in self._segments:
            seg.close()
        self._segments.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()


@logged_api("kiln.comm.fused_allreduce_add_rmsnorm", mutates=("x", "residual"))
@traced(comm_traces.FUSED_ALLREDUCE_ADD_RMSNORM)
def fused_allreduce_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, comm: CustomAllReduce
) -> None:
    """In place, collective: ``residual += all_reduce(x)``, then ``x = rmsnorm(residual) * weight``.

    x, residual: ``[tokens, hidden]`` (or any ``[..., hidden]``) of one dtype, contiguous and not
    overlapping; weight: ``[hidden]`` of that dtype. The sum rounds to the dtype before it is added
    to residual, and residual rounds before it is normalised, as all_reduce followed by
    ``kiln.fused_add_rmsnorm`` would (the host backend runs exactly that sequence).
    """
    api = "kiln.comm.fused_allreduce_add_rmsnorm"
    for name, t in (("x", x), ("residual", residual), ("weight", weight)):
        _is_tensor(api, name, t)
    if not isinstance(comm, CustomAllReduce):
        raise TypeError(f"{api}: comm must be a kiln.comm.CustomAllReduce, got {type(comm).__name__}")
    _check_dtype(api, "x", x)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValueError(
            f"{api}: residual must have x's shape and dtype ({list(x.shape)}, {x.dtype}), "
            f"got ({list(residual.shape)}, {residual.dtype})"
        )
    if x.dim() < 1 or weight.shape != x.shape[-1:] or weight.dtype != x.dtype:
        raise ValueError(
            f"{api}: weight must be [{x.shape[-1] if x.dim() else '?'}] of {x.dtype}, got "
            f"{list(weight.shape)} of {weight.dtype}"
        )
    if not x.is_contiguous():
        raise ValueError(
            f"{api}: x must be contiguous (it is written in place), got strides {list(x.stride())}"
        )
    comm._check_open(api)  # noqa: SLF001
    if torch.compiler.is_compiling():
        _fused_op.op(comm.handle, x, residual, weight, float(eps))
        return
    _fused_into(comm, x, residual, weight, eps)


def _fused_into(comm: CustomAllReduce, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                eps: float) -> None:
    """fused_allreduce_add_rmsnorm after its checks (the eager call and the custom op's body)."""
    if (
        comm._cuda is not None
        and x.device == comm.device
        and 0 < x.numel() * x.element_size() <= comm.max_size
    ):  # noqa: SLF001
        comm._cuda_fused(x, residual, weight, eps)  # noqa: SLF001
        return
    from .norm import fused_add_rmsnorm

    comm.all_reduce(x, out=x)
    fused_add_rmsnorm(x, residual, weight, eps)


@custom_op("comm_all_reduce", mutates=("out",))
def _all_reduce_op(handle: int, x: torch.Tensor, out: torch.Tensor) -> None:
    _communicator(handle, "kiln::comm_all_reduce")._all_reduce_into(x, out)  # noqa: SLF001


@custom_op("comm_fused_allreduce_add_rmsnorm", mutates=("x", "residual"))
def _fused_op(handle: int, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    _fused_into(_communicator(handle, "kiln::comm_fused_allreduce_add_rmsnorm"), x, residual, weight, eps)
