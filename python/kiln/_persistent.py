"""Device memory kiln keeps between calls, made outside the memory pool of a CUDA graph being
warmed up.

kiln keeps a few tensors on a device across calls: the per-device index-error record
(kiln/errors.py), the workspace and the plans of the single-request attention ops, small
constant tables. torch.compile's CUDA graph trees (mode="reduce-overhead") run each new graph
once eagerly before recording it, with every allocation of that thread routed to the graph's
private pool (as torch.cuda.use_mem_pool routes a thread; no stream is capturing, so
torch.cuda.is_current_stream_capturing() is False). A tensor made there and kept is a block of
the pool that the tree does not know is alive: it checks after the warm-up that the pool holds
only the graph's outputs and stops ("Detected N tensor(s) in the cudagraph pool not tracked as
outputs"), and it would otherwise hand the block to the graph's next tensors.

`outside_graph_pools(device, build, *args)` therefore runs `build(*args)` on kiln's worker
thread, which no pool routes, on the caller's current stream (what `build` copies is ordered
before the caller's next launch). A `build` that calls it again runs inline. The cost is one
hand-off to the thread (tens of microseconds), paid only when something new is kept (the first
call on a device, a plan of a new shape), never by a call that reuses what is kept.

While the caller's stream is capturing (torch.cuda.graph), `build` runs inline, as a plain call
would: another thread may not allocate device memory during a capture in torch's default
("global") mode. What it allocates then lives in the graph's pool, where a block held by a live
tensor is never given out again; but its work is recorded, not run, so kiln's first call on a
device and the single-request ops' first call of a shape belong before the capture (the warm-up
torch.cuda.graph asks for).
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch

_worker: ThreadPoolExecutor | None = None
_worker_pid = 0
_lock = threading.Lock()
_state = threading.local()  # .inside: this thread is running a build


def _executor() -> ThreadPoolExecutor:
    global _worker, _worker_pid
    with _lock:
        if _worker is None or _worker_pid != os.getpid():  # a forked child inherits no thread
            _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-persistent")
            _worker_pid = os.getpid()
        return _worker


def outside_graph_pools(device: torch.device, build, /, *args, **kwargs):
    """`build(*args, **kwargs)` with what it allocates on `device` outside a warming CUDA graph's
    pool (the module docstring says how): for what kiln keeps across calls. Its exceptions are
    raised here."""
    if getattr(_state, "inside", False):
        return build(*args, **kwargs)
    stream = None
    if device.type == "cuda":
        with torch.cuda.device(device):
            if torch.cuda.is_current_stream_capturing():
                return build(*args, **kwargs)
            stream = torch.cuda.current_stream()
    try:
        future = _executor().submit(_build, stream, build, args, kwargs)
    except RuntimeError:  # the interpreter is shutting down: no graph is warmed up any more
        return _build(stream, build, args, kwargs)
    return future.result()


def _build(stream, build, args, kwargs):
    _state.inside = True
    try:
        if stream is None:
            return build(*args, **kwargs)
        with torch.cuda.device(stream.device), torch.cuda.stream(stream):
            return build(*args, **kwargs)
    finally:
        _state.inside = False
