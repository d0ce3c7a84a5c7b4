"""`python -m kiln replay <dump>`: re-run a dumped call and compare it with what was recorded.

The call's function is found by its API name among the registered APIs (importing the module that
defined it); its arguments are rebuilt from call.json and inputs.safetensors with their recorded
layouts; its outputs (mutated arguments, result) are compared with outputs.safetensors: bitwise
first, then within torch.testing's default tolerance for the dtype (unless --exact). A record whose
status is "started" belongs to a call that never returned: the process died during it.

Exit status of a replay: 0 the recorded behaviour was reproduced (same outputs, or the same
exception), 1 it was not, 2 the dump cannot be replayed (the message says why).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path

import torch

from . import describe, registry
from .dump import CALL_JSON, FORMAT
from .record import Decoder, ReplayError

REPRODUCED, DIFFERENT, UNUSABLE = 0, 1, 2
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def find_dumps(path: Path) -> list[Path]:
    """The call directories at or below `path` (a call directory, its call.json, or a session)."""
    if path.is_file() and path.name == CALL_JSON:
        return [path.parent]
    if (path / CALL_JSON).is_file():
        return [path]
    found = sorted(p.parent for p in path.rglob(CALL_JSON)) if path.is_dir() else []
    if not found:
        raise ReplayError(f"{path} holds no dump: no {CALL_JSON} in it or below it (a dump is a "
                          "directory such as $KILN_DUMP_DIR/<session>/00003-kiln.rmsnorm)")
    return found


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        return {}
    from safetensors.torch import load_file

    return load_file(str(path))


def _entry(record: dict):
    function = record.get("function") or {}
    try:
        importlib.import_module(function.get("module") or "kiln")
    except ImportError as e:
        raise ReplayError(f"cannot import {function.get('module')!r}, which defined "
                          f"{record['api']}: {e}") from e
    entry = registry.registered().get(record["api"])
    if entry is None:
        known = ", ".join(sorted(registry.registered()))
        raise ReplayError(f"no API named {record['api']!r} in this kiln (registered: {known}); "
                          "replay it with the kiln version that recorded it")
    params = list(entry.signature.parameters) if entry.signature else []
    if params[:1] == ["self"]:
        raise ReplayError(f"{record['api']} is a method of a plan/run wrapper: replaying it needs "
                          "the wrapper's plan, which a dump does not hold")
    return entry


def _device(record: dict, device: str | None) -> torch.device | None:
    if device:
        return torch.device(device)
    recorded = {a.get("device") for a in [*record["args"], *record["kwargs"].values()]
                if "tensor" in a}
    if any(d and d.startswith("cuda") for d in recorded) and not torch.cuda.is_available():
        raise ReplayError(f"the call ran on {', '.join(sorted(filter(None, recorded)))} but torch sees "
                          "no CUDA device here; pass --device cpu to replay it on the host backend")
    return None


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(_BITS[t.element_size()]) if t.is_floating_point() else t


def compare(actual: object, expected: torch.Tensor, exact: bool) -> tuple[bool, str]:
    """(matches, what was found) for one output."""
    if not isinstance(actual, torch.Tensor):
        return False, f"expected a tensor, the replay produced {describe.value(actual)}"
    actual = actual.detach().cpu()
    shape = f"{list(expected.shape)} {str(expected.dtype).removeprefix('torch.')}"
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return False, (f"expected {shape}, the replay produced {list(actual.shape)} "
                       f"{str(actual.dtype).removeprefix('torch.')}")
    if torch.equal(_bits(actual), _bits(expected)):
        return True, f"identical ({shape})"
    if exact:
        return False, f"differs ({shape}); replayed {describe.stats(actual)}"
    try:
        torch.testing.assert_close(actual, expected, equal_nan=True)
    except AssertionError as e:
        detail = " ".join(line.strip() for line in str(e).splitlines()[1:4])
        return False, f"differs beyond tolerance ({shape}): {detail}"
    diff = (actual.double() - expected.double()).abs().nan_to_num(0).max().item()
    return True, f"close ({shape}, max abs diff {diff:.3g}, within torch.testing's tolerance)"


def replay(call_dir: Path, device: str | None = None, exact: bool = False,
           say: Callable[[str], None] = print) -> int:
    """Replay one dumped call; returns REPRODUCED, DIFFERENT or UNUSABLE."""
    say(f"replay {call_dir}")
    try:
        record = json.loads((call_dir / CALL_JSON).read_text())
        if record.get("format") != FORMAT:
            raise ReplayError(f"dump format {record.get('format')} is not {FORMAT} (recorded by kiln "
                              f"{record.get('environment', {}).get('kiln_version')})")
        entry = _entry(record)
        target = _device(record, device)
        decoder = Decoder(_load_tensors(call_dir / record["inputs_file"]), target)
        args = [decoder.decode(a, a["name"]) for a in record["args"]]
        kwargs = {k: decoder.decode(v, k) for k, v in record["kwargs"].items()}
    except (ReplayError, OSError, ValueError, KeyError) as e:
        say(f"  cannot replay: {e}")
        return UNUSABLE

    dev = record.get("device") or {}
    forced = record.get("forced_backend")
    say(f"  {record['api']} on {target or dev.get('device')} (recorded on {dev.get('device')} "
        f"{dev.get('name', '')}, backend {record.get('backend')}"
        f"{f', forced by KILN_FORCE_BACKEND={forced}' if forced else ''}; kiln "
        f"{record.get('environment', {}).get('kiln_version')}; status {record['status']})")
    try:
        result = entry.fn(*args, **kwargs)
    except Exception as e:
        raised = f"{type(e).__qualname__}: {e}"
        if record["status"] == "raised":
            same = type(e).__qualname__ == record["error"]["type"]
            say(f"  raised {raised} ({'as recorded' if same else 'recorded: ' + record['error']['type']})")
            return REPRODUCED if same else DIFFERENT
        say(f"  raised {raised}; the recorded call {record['status']}")
        return DIFFERENT

    named = describe.named_arguments(entry.signature, tuple(args), kwargs)
    produced = dict(entry.outputs(result, named))
    if record["status"] == "raised":
        say(f"  returned normally; the recorded call raised {record['error']['type']}: "
            f"{record['error']['message']}")
        return DIFFERENT
    if record["status"] != "completed":
        say("  the recorded call never returned (the process died during it); here it completed:")
        for name, v in produced.items():
            for tname, t in describe.tensors_in(v, name):
                say(f"  {tname}: {describe.value(t)}\n    stats: {describe.stats(t)}")
        return DIFFERENT
    if "outputs_file" not in record:
        say(f"  the recorded outputs were not saved ({'; '.join(record.get('notes', []))}); "
            "nothing to compare")
        return REPRODUCED
    stored = _load_tensors(call_dir / record["outputs_file"])
    results = [_check_output(name, spec, produced.get(name), stored, exact, say)
               for name, spec in record["outputs"].items()]
    ok = all(results)
    say(f"  => {'reproduced' if ok else 'NOT reproduced'}: {len(results)} output(s) compared")
    return REPRODUCED if ok else DIFFERENT


def _check_output(name: str, spec: dict, produced: object, stored: dict, exact: bool,
                  say: Callable[[str], None]) -> bool:
    """Compare one recorded output (a tensor, or a tuple/list of them) with the replay's."""
    for kind in ("tuple", "list"):
        if kind in spec:
            items = spec[kind]
            if not isinstance(produced, tuple | list) or len(produced) != len(items):
                say(f"  {name}: expected a {kind} of {len(items)}, the replay produced "
                    f"{describe.value(produced)}")
                return False
            return all([_check_output(f"{name}[{i}]", s, p, stored, exact, say)
                        for i, (s, p) in enumerate(zip(items, produced, strict=True))])
    key = spec.get("tensor") or spec.get("alias")
    if key is None:
        same = "value" in spec and spec["value"] == produced
        say(f"  {name}: {'same' if same else 'differs'}: recorded {spec}, replayed "
            f"{describe.value(produced)}")
        return same
    if key not in stored:
        say(f"  {name}: not saved in the dump; not compared")
        return True
    matches, text = compare(produced, stored[key], exact)
    say(f"  {name}: {text}")
    return matches
