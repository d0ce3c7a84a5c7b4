"""Entry points declared in BUILD files, and the binding, custom op and trace tensors made from them.

The generated launchers run in every converted family's own tests (activation, norm, rope: CPU
here, CUDA on the GPU); these tests pin the declarations' checks and the generated text."""

import pytest

from kiln.codegen.binding import render_binding
from kiln.codegen.graph import load_graph
from kiln.codegen.rules import BuildFileError
from tests.codegen.test_graph import make_tree

ENTRY = """
op_library(
    name="x", host_srcs=["x.cc"], headers=["ops/x/x.h"], dispatch={{"dtype": ["f16"]}},
    entries=[entry("go", doc="d", args=[{args}], params=params("P", a="1"), call="kiln::x::go"{extra})])
"""


def declare(tmp_path, args: str, extra: str = ""):
    return make_tree(tmp_path, {"x": ENTRY.format(args=args, extra=extra)}).target("//ops:x")


@pytest.mark.parametrize("args,extra,match", [
    ('tensor("a", shape=["d", "*rows"])', "", "must be the shape's first entry"),
    ('tensor("a", shape=["2x"])', "", "must be a size name"),
    ('tensor("a", dtype="float128")', "", "must be 'elem', a torch name"),
    ('tensor("a", dtype={"int4": "X"})', "", "dtype= names"),
    ('tensor("a", access="x")', "", "access='x' must be"),
    ('tensor("a", may_alias="b")', "", "may_alias= is for a written tensor"),
    ('tensor("a", access="w")', "", "needs a tensor it reads that is not optional"),
    ('tensor("a"), scalar("stream", "int")', "", "launch arguments the entry adds itself"),
    ('tensor("a"), tensor("a")', "", "argument names repeat"),
    ('tensor("a"), scalar("e", "double")', "", "type='double' must be one of"),
    ('tensor("a")', ', dispatch={"dtype": "b.dtype"}', "must be an argument's attribute"),
    ('tensor("a")', ', api="kiln.{b}"', "names 'b', not an argument"),
    ('tensor("a"), tensor("o", access="w", may_alias="z")', "", "may_alias='z', not an argument"),
])
def test_invalid_entries_are_rejected_with_the_file_named(tmp_path, args, extra, match):
    with pytest.raises(BuildFileError, match=match) as e:
        declare(tmp_path, args, extra)
    assert "BUILD.py" in str(e.value)


def test_a_target_takes_a_binding_or_entries_not_both(tmp_path):
    both = 'op_library(name="x", host_srcs=["x.cc"], binding="b.cc", entries=[])'
    with pytest.raises(BuildFileError, match="needs binding= .* or entries="):
        make_tree(tmp_path, {"x": both.replace("entries=[]", 'entries=[entry("g", doc="", '
                                               'args=[tensor("a")], params=params("P", a="1"), call="g")]')})
    with pytest.raises(BuildFileError, match="needs binding= .* or entries="):
        make_tree(tmp_path, {"x": 'op_library(name="x", host_srcs=["x.cc"])'})


def test_the_shape_relations_become_checks_in_order(tmp_path):
    t = declare(tmp_path, 'tensor("out", shape=["*rows", "d"], access="w", may_alias="input"), '
                          'tensor("input", shape=["*rows", "2*d"], ndim=(2, 3)), '
                          'tensor("weight", shape=["2*d"], dtype="float32"), '
                          'tensor("scale", numel=1, dtype="float32", optional=True), '
                          'tensor("q", dtype={"float8_e4m3fn": "F::kE4M3", "float8_e5m2": "F::kE5M2"}, '
                          'access="w"), scalar("eps", "float"), choice("mode", {"a": "M::kA", "b": "M::kB"})',
                extra=', pdl=True, errors=True, '
                      'requires=[require("eps >= 0", "eps must be >= 0, got {eps}")]')
    text = render_binding(t, has_dtype=True)
    body = text[text.index("void go("):]
    expected = [
        "void go(py::handle out_obj, py::handle input_obj, py::handle weight_obj, py::handle scale_obj, "
        "py::handle q_obj, double eps, int64_t mode_index, bool pdl, uintptr_t errors, uintptr_t stream) {",
        # the anchor first: the first tensor read
        'const TensorView input = kb::view_of(input_obj, "input");',
        "kb::check_backend_device(input);",
        'kb::check_dtype(input, kDType, std::string("this module is ") + kiln::spec::kUri);',
        "kb::check_ndim_between(input, 2, 3);",
        'kb::check_multiple(input, -1, 2, "2*d");',
        "[[maybe_unused]] const int64_t dim_d = input.size(-1) / 2;",
        "kb::check_last_contiguous(input);",
        "kb::check_element_aligned(input, sizeof(Elem));",
        "kb::check_same_device(out, input);",
        'kb::check_dtype(out, kDType, "the dtype of input");',
        'kb::check_lead_shape(out, input, 1, {dim_d}, "input.shape[:-1] + [input.shape[-1] / 2]");',
        'kb::check_dtype(weight, kb::dl_dtype<float>(), "weight is float32");',
        "kb::check_ndim_between(weight, 1, 1);",
        'kb::check_dim(weight, 0, 2 * dim_d, "2 * input.shape[-1] / 2");',
        "if (!scale_obj.is_none()) {",
        "kb::check_numel(scale, 1);",
        "if (q.dtype == kb::dl_dtype<kiln::e4m3_t>()) return F::kE4M3;",
        'kb::type_error("q.dtype must be float8_e4m3fn or float8_e5m2, got " + kb::dtype_str(q.dtype));',
        "kb::check_element_aligned(q, (q.dtype.bits + 7) / 8);",
        # what it writes: no self-overlap, no byte shared, except in place where declared
        "kb::check_no_internal_overlap(out);",
        "if (!kb::same_view(out, input)) kb::check_disjoint(out, input);",
        "kb::check_disjoint(out, weight);",
        "if (scale.data) kb::check_disjoint(out, scale);",
        "kb::check_disjoint(out, q);",
        "kb::check_no_internal_overlap(q);",
        "if (scale.data) kb::check_disjoint(scale, q);",
        "case 1:",
        "return M::kB;",
        'if (!(eps >= 0)) kb::value_error(std::string("eps must be >= 0, got ") + std::to_string(eps));',
        "P p{};",
        "p.a = 1;",
        "const kiln::LaunchContext ctx = kb::launch_context(input, stream, errors, pdl);",
        "s = kiln::x::go(p, ctx);",
        "kb::raise_if_failed(s, kiln::spec::kUri);",
    ]
    at = 0
    for line in expected:
        found = body.find(line, at)
        assert found >= 0, f"missing or out of order: {line}\n{body}"
        at = found + len(line)
    assert "kb::check_disjoint(q, out)" not in body  # each pair once
    assert '#include "ops/x/x.h"' in text and "kb::export_error_texts(m);" in text
    assert ('py::arg("mode"), py::arg("pdl") = false, py::arg("errors") = 0, py::arg("stream") = 0' in
            " ".join(text.split()))
    assert all(len(line) <= 110 for line in text.splitlines() if line.lstrip().startswith(("m.def", "py::")))


def test_an_elem_tensor_needs_a_dtype_axis(tmp_path):
    t = declare(tmp_path, 'tensor("a")')
    with pytest.raises(ValueError, match="no dtype axis"):
        render_binding(t, has_dtype=False)


def test_activation_is_generated_and_its_key_follows_the_build_file():
    from kiln.codegen import render
    from kiln.codegen.dispatch import specialisation
    from kiln.codegen.specs import compile_spec

    graph = load_graph()
    target = graph.target("//ops:activation")
    assert target.binding == "" and [e.name for e in target.entries] == ["act_and_mul"]
    spec = compile_spec(specialisation(target, {"dtype": "bf16"}), "host", graph)
    assert spec.units[-1].name == "activation_binding.cc"
    inputs = {p.name for p in render.template_inputs(specialisation(target, {"dtype": "bf16"}))}
    assert {"BUILD.py", "binding.py", "entries.py"} <= inputs


def test_the_python_launcher_and_the_op_schema_follow_the_entry():
    import torch

    import kiln.activation  # noqa: F401 - registers kiln::act_and_mul
    from kiln._entries import find_entry, launcher_source

    source = launcher_source(find_entry("//ops:activation", "act_and_mul"), "//ops:activation")
    assert source == (
        "def act_and_mul(out: torch.Tensor, input: torch.Tensor, act: str, pdl: bool) -> None:\n"
        "    mod = _modules.get(f'kiln.{act}_and_mul', input.device, input.dtype)\n"
        "    mod.act_and_mul(_dl(out), _dl(input), _choice_act[act], pdl, _stream_of(input.device))\n")
    schema = str(torch.ops.kiln.act_and_mul.default._schema)
    assert schema == "kiln::act_and_mul(Tensor(a0!) out, Tensor input, str act, bool pdl) -> ()"
    with pytest.raises(LookupError, match="declares no entry 'nope'; its entries: act_and_mul"):
        find_entry("//ops:activation", "nope")


def test_an_in_place_variant_passes_the_input_for_the_output_it_aliases():
    from kiln._entries import entry_op, find_entry, launcher_source

    entry = find_entry("//ops:activation", "act_and_mul")
    source = launcher_source(entry, "//ops:activation", fn_name="act_and_mul_inplace",
                             alias={"out": "input"}, api="kiln.act_inplace")
    assert source == (
        "def act_and_mul_inplace(input: torch.Tensor, act: str, pdl: bool) -> None:\n"
        "    mod = _modules.get('kiln.act_inplace', input.device, input.dtype)\n"
        "    mod.act_and_mul(_dl(input), _dl(input), _choice_act[act], pdl, _stream_of(input.device))\n")
    with pytest.raises(ValueError, match="needs an op_name of its own"):
        entry_op("//ops:activation", "act_and_mul", alias={"out": "input"})
    with pytest.raises(ValueError, match="alias 'input': 'out' must map a tensor the entry writes"):
        entry_op("//ops:activation", "act_and_mul", op_name="x_inplace", alias={"input": "out"})


def test_an_indptr_dimension_binds_its_size_minus_the_constant(tmp_path):
    t = declare(tmp_path, 'tensor("indptr", shape=["batch+1"], dtype="int32"), '
                          'tensor("offsets", shape=["batch"], dtype="int32"), '
                          'tensor("ends", shape=["batch+1"], dtype="int32")')
    body = render_binding(t, has_dtype=True)
    for line in ('kb::check_size_at_least(indptr, 0, 1, "batch + 1");',
                 "[[maybe_unused]] const int64_t dim_batch = indptr.size(0) - 1;",
                 'kb::check_dim(offsets, 0, dim_batch, "indptr.shape[0] - 1");',
                 'kb::check_dim(ends, 0, dim_batch + 1, "indptr.shape[0] - 1 + 1");'):
        assert line in body, line
    from kiln.codegen.entries import tensor
    assert tensor("x", shape=["n+2"]).shape[0].spelling() == "n+2"


def test_size_words_name_where_a_size_came_from_in_shape_errors(tmp_path):
    t = declare(tmp_path, 'tensor("q", shape=["nnz", "heads", "dim"]), '
                          'tensor("k", shape=["nnz", "kv", "dim"])',
                extra=', size_words={"nnz": "q.shape[0] (nnz)"}')
    body = render_binding(t, has_dtype=True)
    assert 'kb::check_dim(k, 0, dim_nnz, "q.shape[0] (nnz)");' in body
    assert 'kb::check_dim(k, 2, dim_dim, "q.shape[2]");' in body
    (tmp_path / "b").mkdir()
    with pytest.raises(BuildFileError, match="size_words= names 'tokens', not a declared size"):
        declare(tmp_path / "b", 'tensor("q", shape=["nnz"])', extra=', size_words={"tokens": "x"}')


def test_require_messages_take_sizes_and_cpp_expressions(tmp_path):
    t = declare(tmp_path, 'tensor("q", shape=["nnz", "dim"]), scalar("rd", "int")',
                extra=', requires=[require("rd <= dim_dim && q.ndim == 2", '
                      '"rd must be in [2, dim = {dim}], got {rd} (q {q}, {q.size(-1)} / {kMax})")]')
    body = render_binding(t, has_dtype=True)
    want = ('if (!(rd <= dim_dim && q.ndim == 2)) kb::value_error(std::string("rd must be in '
            '[2, dim = ") + std::to_string(dim_dim) + "], got " + std::to_string(rd) + " (q " + '
            'q.shape_str() + ", " + std::to_string(q.size(-1)) + " / " + std::to_string(kMax) + ")");')
    assert want in body


def test_band_entries_check_each_output_against_what_is_read_and_written_before_it(tmp_path):
    t = declare(tmp_path, 'tensor("q_out", access="w", may_alias="q"), tensor("k_out", access="w", '
                          'may_alias="k"), tensor("q"), tensor("k"), tensor("pos", dtype="int32")',
                extra=", bands=True")
    body = render_binding(t, has_dtype=True)
    checks = [line.strip() for line in body.splitlines() if "overlap" in line or "apart" in line]
    assert checks == [
        "kb::check_no_internal_overlap(q_out);",
        "if (!kb::same_view(q_out, q)) kb::check_apart(kb::in_place_named(q_out, q), q);",
        "kb::check_apart(kb::in_place_named(q_out, q), k);",
        "kb::check_apart(kb::in_place_named(q_out, q), pos);",
        "kb::check_no_internal_overlap(k_out);",
        "kb::check_apart(kb::in_place_named(k_out, k), q);",
        "if (!kb::same_view(k_out, k)) kb::check_apart(kb::in_place_named(k_out, k), k);",
        "kb::check_apart(kb::in_place_named(k_out, k), pos);",
        "kb::check_apart(kb::in_place_named(k_out, k), kb::in_place_named(q_out, q));",
    ]
    assert "check_disjoint" not in body


def test_bytes_tensors_and_computed_scalars_are_the_launchers(tmp_path):
    from kiln._entries import launcher_source

    t = declare(tmp_path, 'tensor("out", dtype="uint8", access="w", as_bytes=True), tensor("x"), '
                          'scalar("e5m2", "bool", value="out.dtype == torch.float8_e5m2")')
    source = launcher_source(t.entries[0], "//ops:x")
    assert source.splitlines()[0] == "def go(out: torch.Tensor, x: torch.Tensor) -> None:"
    assert "mod.go(_dl(out.view(torch.uint8)), _dl(x), (out.dtype == torch.float8_e5m2), " in source
    (tmp_path / "b").mkdir()
    with pytest.raises(BuildFileError, match="as_bytes= passes a uint8 view"):
        declare(tmp_path / "b", 'tensor("out", access="w", as_bytes=True), tensor("x")')


def test_a_tensor_like_another_has_its_shape_and_is_checked_after_it(tmp_path):
    t = declare(tmp_path, 'tensor("q_out", access="w", like="q"), tensor("k_out", access="w", like="k"), '
                          'tensor("q", shape=["n", "d"]), tensor("k", shape=["n", "e"])')
    body = render_binding(t, has_dtype=True)
    views = [line.split()[2] for line in body.splitlines() if "kb::view_of(" in line]
    assert views == ["q", "q_out", "k", "k_out"]
    assert "kb::check_same_shape(k_out, k);" in body and "kb::check_same_shape(q_out, q);" in body
    (tmp_path / "b").mkdir()
    with pytest.raises(BuildFileError, match="like='z', not another tensor"):
        declare(tmp_path / "b", 'tensor("o", access="w", like="z"), tensor("x")')
