"""Trace templates stay in step with the public API and the committed definitions:
every public API has one, its inputs and axes agree with the API's signature, its reference
produces the declared outputs, and regenerating the definitions changes nothing."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

import kiln
from benchmarks import definitions
from kiln.trace import Scalar, Tensor, TraceTemplate, const, registry, traced, traced_apis, var
from kiln.trace.consistency import signature_problems
from kiln.trace.registry import Traced

APIS = traced_apis()


def public_apis():
    """kiln's public callables that are ops: functions, and the `run` of plan/run classes (the
    tools, kiln._TOOLS, have no workload to describe)."""
    for name in kiln.__all__:
        if name in kiln._TOOLS:
            continue
        obj = getattr(kiln, name)
        if inspect.isclass(obj):
            yield f"kiln.{name}.run", getattr(obj, "run", None)
        elif callable(obj) and not inspect.ismodule(obj):
            yield f"kiln.{name}", obj


# Public APIs that landed before they could carry a trace template: each is owed one. Shrink this
# set, never grow it; the test
# below fails when an API listed here gains a template, so the list cannot go stale.
AWAITING_TEMPLATES: set[str] = set()


@pytest.mark.parametrize("name,fn", list(public_apis()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_public_api_has_a_trace_template(name, fn):
    assert fn is not None, f"{name}: a public class must have run() (the traced method)"
    template = getattr(fn, "__kiln_trace__", None)
    if name in AWAITING_TEMPLATES:
        assert template is None, f"{name} has a trace template now: remove it from AWAITING_TEMPLATES"
        return
    assert isinstance(template, TraceTemplate), f"{name} has no trace template: add @traced(...)"
    assert APIS[template.name].api == name


def test_awaiting_templates_are_public_apis():
    assert AWAITING_TEMPLATES <= {name for name, _ in public_apis()}


@pytest.mark.parametrize("name", APIS)
def test_template_agrees_with_the_api_signature(name):
    assert signature_problems(APIS[name]) == []


@pytest.mark.parametrize("name", APIS)
def test_public_path_reaches_the_traced_function(name):
    traced_ = APIS[name]
    obj = kiln
    for part in traced_.api.split(".")[1:]:
        obj = getattr(obj, part)
    assert inspect.unwrap(obj) is inspect.unwrap(traced_.function)


def _api(**params):
    """A stand-in API with the given parameters (name -> default or inspect.Parameter.empty)."""
    ps = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=d,
                            annotation="torch.Tensor" if d is inspect.Parameter.empty else "float")
          for n, d in params.items()]

    def fn(*args, **kwargs):
        pass

    fn.__signature__ = inspect.Signature(ps)
    fn.__qualname__ = "toy"
    return fn


TOY = TraceTemplate(
    name="toy", description="y = x * s", axes={"n": var(), "d": const(8)},
    inputs={"x": Tensor(("n", "d")), "s": Scalar("float32", 2.0)}, outputs={"y": Tensor(("n", "d"))},
    reference=lambda x, s: {"y": x * s}, tolerance={"float32": (0.0, 0.0)}, examples=(),
    small=({"n": 3},))


def test_signature_problems_name_each_disagreement():
    empty = inspect.Parameter.empty
    assert signature_problems(Traced(TOY, _api(x=empty, s=2.0))) == []
    problems = signature_problems(Traced(TOY, _api(x=empty, s=1.0, flag=False)))
    assert any("s defaults to 1.0, template toy says 2.0" in p for p in problems)
    assert any("parameter 'flag' is not an input, output or option" in p for p in problems)
    problems = signature_problems(Traced(TOY, _api(input=empty, s=2.0)))
    assert any("input 'x' is not a parameter" in p for p in problems)


def test_a_template_cannot_be_attached_to_two_apis(monkeypatch):
    monkeypatch.setattr(registry, "_TRACED", {})  # keep the toy out of the real registry

    def first(x, s=2.0):
        pass

    def second(x, s=2.0):
        pass

    traced(TOY)(first)
    with pytest.raises(ValueError, match="attached to both"):
        traced(TOY)(second)


def test_axes_are_checked_when_resolved():
    with pytest.raises(ValueError, match="axis 'd' is constant"):
        TOY.resolve_axes({}, {"n": 1, "d": 4})
    with pytest.raises(ValueError, match="no value for the var axis 'n'"):
        TOY.resolve_axes({}, {})
    with pytest.raises(ValueError, match=r"unknown axes \['m'\]"):
        TOY.resolve_axes({}, {"n": 1, "m": 2})
    with pytest.raises(ValueError, match=r"inputs\['x'\]: dimension 'k' names 'k', which is not an axis"):
        TraceTemplate(name="bad", description="", axes={"n": var()}, inputs={"x": Tensor(("k",))},
                      outputs={}, reference=lambda x: {}, tolerance={}, examples=(), small=())
    with pytest.raises(ValueError, match="only axis names, integers"):
        TraceTemplate(name="bad", description="", axes={"n": var()}, inputs={"x": Tensor(("n**2",))},
                      outputs={}, reference=lambda x: {}, tolerance={}, examples=(), small=())


# A plan/run API in the shape of paged decode: the template is attached to run(), plan() takes
# the index tensors and axis-valued scalars; shapes use expressions of axes.
def _paged_inputs(t, axes, dtype, device, gen):
    pages = -(-axes["kv_len"] // axes["page_size"])
    indptr = torch.arange(axes["batch"] + 1, dtype=torch.int32) * pages
    return {"indptr": indptr.to(device)}


PAGED = TraceTemplate(
    name="toy_paged", description="out = q summed over each sequence's pages",
    axes={"batch": var(), "kv_len": var(), "page_size": const(16), "heads": const()},
    inputs={"q": Tensor(("batch", "heads")),
            "pages": Tensor(("batch * cdiv(kv_len, page_size)", "page_size", "heads")),
            "indptr": Tensor(("batch + 1",), "int32"),
            "num_heads": Scalar("int32", axis="heads"), "page_size": Scalar("int32", axis="page_size")},
    outputs={"out": Tensor(("batch", "heads"))},
    reference=lambda q, pages, indptr, num_heads, page_size: {"out": q},
    tolerance={"float32": (0.0, 0.0)}, examples=(), small=({"batch": 3, "kv_len": 40},),
    plan_inputs=("indptr", "num_heads", "page_size"), options={"layout": "storage order, no workload"},
    make_inputs=_paged_inputs)


class ToyWrapper:
    def __init__(self, layout="NHD"):
        pass

    def plan(self, indptr: torch.Tensor, num_heads: int, page_size: int, layout: str = "NHD"):
        pass

    @traced(PAGED)
    def run(self, q: torch.Tensor, pages: torch.Tensor, out: torch.Tensor | None = None):
        pass


def test_plan_run_templates_build_inputs_and_check_both_signatures():
    axes = PAGED.resolve_axes({"heads": 4}, PAGED.small[0])
    inputs = PAGED.build_inputs(axes, "float32", "cpu", seed=0)
    assert inputs["pages"].shape == (3 * 3, 16, 4) and inputs["indptr"].tolist() == [0, 3, 6, 9]
    assert inputs["num_heads"] == 4 and inputs["page_size"] == 16
    traced_ = registry._TRACED.pop("toy_paged")  # keep the toy out of the real registry
    assert traced_.api == "kiln.ToyWrapper.run"
    assert signature_problems(traced_) == []

    class Drifted(ToyWrapper):
        def plan(self, indptr: torch.Tensor, num_qo_heads: int, page_size: int, layout: str = "NHD"):
            pass

    import sys

    sys.modules[__name__].Drifted = Drifted
    try:
        problems = signature_problems(Traced(PAGED, _retarget(ToyWrapper.run, "Drifted.run")))
    finally:
        del sys.modules[__name__].Drifted
    assert any("Drifted.plan: template toy_paged input 'num_heads' is not a parameter" in p
               for p in problems)
    assert any("Drifted.plan: parameter 'num_qo_heads' is not an input" in p for p in problems)


def _retarget(fn, qualname):
    def g(self, q: torch.Tensor, pages: torch.Tensor, out: torch.Tensor | None = None):
        pass

    g.__qualname__, g.__module__ = qualname, fn.__module__
    return g


# Outputs whose definition holds infinities: -inf marks a masked logit.
INFINITE_OUTPUTS = {("top_k_mask_logits", "masked_logits")}


@pytest.mark.parametrize("name", APIS)
def test_reference_produces_the_declared_outputs(name):
    t = APIS[name].template
    ex = t.examples[0]
    for w in t.small:
        axes = t.resolve_axes(ex.consts, w)
        inputs = t.build_inputs(axes, t.dtypes[0], "cpu", seed=1, scalars=ex.scalars)
        before = {k: v.clone() for k, v in inputs.items() if isinstance(v, torch.Tensor)}
        out = t.run_reference(inputs)
        for k, v in before.items():
            assert torch.equal(inputs[k], v), f"{name}'s reference modified its input {k!r}"
        for oname, spec in t.outputs.items():
            assert tuple(out[oname].shape) == t.shape_of(spec, axes)
            if (name, oname) in INFINITE_OUTPUTS:
                assert not out[oname].isnan().any() and out[oname].isfinite().any()
            else:
                assert out[oname].isfinite().all()


# The axes that count requests or tokens, and the sizes the examples must reach (decode
# batches 1-256, prefill 1k-8k tokens). Decode-only ops (paged decode) have no prefill examples.
BATCH_AXES = ("tokens", "batch_size", "seq_len")
TOKEN_AXES = ("tokens", "seq_len", "nnz", "append_len", "qo_len")
DECODE_ONLY = {"batch_decode", "single_decode"}
PREFILL_ONLY = {"batch_prefill", "batch_prefill_ragged", "single_prefill"}


@pytest.mark.parametrize("name", APIS)
def test_examples_are_realistic_model_shapes(name):
    """Named models with sources; decode examples reach a batch of 256 where the op has a
    batch axis, prefill examples 8k tokens."""
    t = APIS[name].template
    phases = {ex.phase for ex in t.examples}
    if name not in PREFILL_ONLY:
        assert "decode" in phases
    if name not in DECODE_ONLY:
        assert "prefill" in phases, f"{name}: add prefill examples"
    for ex in t.examples:
        assert ex.model and ex.source, f"{ex.name}: name the model and where its numbers come from"
        axes = [t.resolve_axes(ex.consts, w) for w in ex.workloads]
        assert all(math.prod(a.values()) > 0 for a in axes)
        wanted = (BATCH_AXES, 256) if ex.phase == "decode" else (TOKEN_AXES, 8192)
        present = [n for n in wanted[0] if n in t.axes]
        if present:
            assert max(a[n] for a in axes for n in present) >= wanted[1], (ex.name, present)


def test_committed_definitions_match_the_templates():
    problems = definitions.stale()
    assert problems == [], ("benchmark definitions are stale; run `python -m benchmarks definitions "
                            "--regenerate` and commit:\n" + "\n".join(problems))


def test_regenerate_rewrites_changed_and_removes_orphaned_files(tmp_path):
    assert definitions.regenerate(tmp_path)
    assert definitions.stale(tmp_path) == []
    one = next(tmp_path.rglob("*.json"))
    one.write_text(one.read_text().replace('"type": "var"', '"type": "const"'))
    (tmp_path / "rmsnorm" / "orphan.json").write_text("{}")
    problems = definitions.stale(tmp_path)
    assert f"{one.relative_to(tmp_path).as_posix()}: differs from its template" in problems
    assert "rmsnorm/orphan.json: no template example produces it" in problems
    changed = definitions.regenerate(tmp_path)
    assert "rmsnorm/orphan.json (removed)" in changed
    assert definitions.stale(tmp_path) == []
