"""FlashInfer's ``enable_pdl`` resolved for one launch, cheaply: :func:`kiln.utils.use_pdl`,
remembered per device. The public ops that take ``enable_pdl`` (norm, activation) resolve it on
every call, and the resolution itself (a device copy and a capability lookup, ~0.7 µs on the host)
would be a tenth of their Python overhead; remembered, it is one dictionary lookup.

None and True resolve alike (on where the device supports it: CUDA sm90+), so the answer depends
on the device alone. Tensors' devices carry their index, so a key names one GPU.

Under torch.compile the answer is a constant of the graph (assume_constant_result: dynamo calls
the function at trace time rather than tracing the capability queries behind it). The function is
marked the way torch.compiler.assume_constant_result marks it, without calling it: that call
imports torch._dynamo (~1 s, the larger part of a warm first call of any op in a fresh process).
tests/test_first_call.py checks that the mark is still torch's.
"""

from __future__ import annotations

import torch

from . import utils

_supported: dict[torch.device, bool] = {}


def resolve(enable_pdl: bool | None, device: torch.device) -> bool:
    """utils.use_pdl(enable_pdl, device): False never launches with PDL; None and True do on sm90+
    CUDA devices; anything else is the TypeError use_pdl raises."""
    if enable_pdl is None or enable_pdl is True:
        found = _supported.get(device)
        if found is None:
            found = _supported[device] = utils.use_pdl(True, device)
        return found
    return utils.use_pdl(enable_pdl, device)


# torch.compiler.assume_constant_result(resolve), without importing torch._dynamo (see above)
resolve._dynamo_marked_constant = True
