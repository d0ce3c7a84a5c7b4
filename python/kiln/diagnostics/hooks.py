"""Where the API layer lets diagnostics watch it, without diagnostics importing the API layer.

    module_observer   None, or f(label, params, device, module): called whenever an API call
                      gets its compiled module (kiln/_jit.py and the plan/run wrappers), so a
                      logged call records which module it used before the kernel runs

diagnostics/call.py sets it when diagnostics are on; while they are off it stays None and each
lookup pays one attribute read.
"""

from __future__ import annotations

from collections.abc import Callable

module_observer: Callable | None = None
