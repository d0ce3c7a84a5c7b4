"""Device index-error codes are owned by their families (ops/common/device_error.h): each family's
header declares its codes with error_code("family", n) and registers its message table when the
module loads; a module exports every table registered in it, and kiln/errors.py merges them. This
checks that no two families share codes and that the C++ codes are the ones Python computes."""

from __future__ import annotations

import re

import torch
from helpers import REPO, device_error_code

from kiln import _jit, errors

_CODE = re.compile(r'error_code\("([a-z_0-9]+)",\s*(\d+)\)')


def _declared() -> dict[str, list[int]]:
    codes: dict[str, list[int]] = {}
    for path in sorted((REPO / "ops").rglob("*.h")):
        for family, n in _CODE.findall(path.read_text()):
            codes.setdefault(family, []).append(int(n))
    return codes


def test_families_own_disjoint_codes():
    declared = _declared()
    assert {"attention", "gemm", "moe", "rope", "sampling"} <= set(declared)
    families = {device_error_code(f, 0): f for f in declared}
    assert len(families) == len(declared), "two families' names hash to the same code bits"
    for family, ns in declared.items():
        assert len(set(ns)) == len(ns) and all(0 < n < 1 << 16 for n in ns), (family, ns)


def test_the_common_header_names_no_family_code():
    text = (REPO / "ops" / "common" / "device_error.h").read_text()
    assert not _CODE.search(text.split("constexpr int64_t error_code(", 1)[1])


def test_a_module_exports_its_family_table_and_python_merges_them():
    rope = _jit.module("//ops:rope", torch.device("cpu"), "test", dtype=torch.bfloat16)
    codes = set(dict(rope.error_texts))
    assert codes == {device_error_code("rope", n) for n in _declared()["rope"]}
    sampling = _jit.module("//ops:sampling", torch.device("cpu"), "test", dtype=torch.float32)
    expected = {device_error_code("sampling", n) for n in _declared()["sampling"]}
    assert set(dict(sampling.error_texts)) == expected
    # both loaded (module() learns each table): a record of either family reads as its message
    assert errors.message(device_error_code("rope", 2), 3, 99, 64) == (
        "positions[3] = 99 is not a row of cos_sin_cache: valid are [0, 64)")
    assert errors.message(device_error_code("sampling", 1), 1, 7, 4).startswith("indices[1] = 7 is not a row")
