"""CI's guard on the Python call path (benchmarks/host_overhead.py): on CPU tensors of one 64-value
row, kiln's per-call time stays within a ratio of torch's eager equivalent on the same machine, so
a regression of the path every call takes (argument checks, module lookup, DLPack, dispatch)
fails here rather than in a later GPU round. A ratio, not an absolute time: it holds on any
machine. The bounds leave room above what this machine measures (rmsnorm ~0.7x, fused_add_rmsnorm
~0.5x, silu_and_mul ~1.6-2.2x torch's two-op expression); 8 µs more on rmsnorm's path measured
1.53x."""

from __future__ import annotations

from benchmarks.host_overhead import breakdown, measure

BOUNDS = {"rmsnorm": 1.25, "fused_add_rmsnorm": 1.0, "silu_and_mul": 3.0}


def test_the_python_call_path_stays_within_a_ratio_of_torch():
    def over(results):
        return {r.op: round(r.ratio, 2) for r in results if r.ratio > BOUNDS[r.op]}

    first = over(measure("cpu", calls=1000, reps=5, ops=list(BOUNDS), hidden=64))
    # what exceeded once is measured again (a shared CI machine's noise): the better of two counts
    again = over(measure("cpu", calls=1000, reps=5, ops=list(first), hidden=64)) if first else {}
    assert again == {}, f"kiln / torch per-call time above the bounds {BOUNDS}: {again} (first run {first})"


def test_the_breakdown_times_each_layer_of_the_call_path_and_the_layers_nest():
    rows = {name: us for name, us, _ in breakdown("cpu", calls=300, reps=3, hidden=64)}
    assert list(rows)[:2] == ["torch F.rms_norm", "kiln.rmsnorm"] and all(us > 0 for us in rows.values())
    # the public call contains the binding call, which contains its capsules: each costs more
    assert rows["kiln.rmsnorm"] > rows["binding call (capsules, stream)"] > rows["3 x _jit.dl"]


def test_softmax_has_a_breakdown_too_and_issue_times_are_reported():
    rows = breakdown("cpu", calls=300, reps=3, hidden=64, op="softmax")
    per_call = {name: us for name, us, _ in rows}
    assert list(per_call)[:2] == ["torch.softmax", "kiln.softmax"]
    binding = per_call["binding softmax_rows (capsules, stream)"]
    assert per_call["kiln.softmax"] > binding > per_call["2 x _jit.dl"]
    assert all(issue > 0 for _, _, issue in rows)
