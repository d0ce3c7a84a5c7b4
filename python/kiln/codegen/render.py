"""Rendering a specialisation's sources into its generated directory.

Each specialisation gets:
  spec_config.h   from templates/spec_config.h.jinja: the URI and one C++ declaration per axis
                  (a type for table axes such as dtype, an integer, a bool, or a string)
  <template>      each of the target's own Jinja templates, rendered with the same context
  <unit>          each compile unit of the toolchain, copied byte for byte
  <name>_binding.cc  the launcher generated from the target's entries (codegen/binding.py),
                  when its BUILD file declares them instead of a hand-written binding
Rendering uses StrictUndefined (a missing variable is an error) and is deterministic; a file is
written only when its content differs.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from kiln.runtime.files import write_if_different

from .dispatch import Specialisation

TEMPLATES = Path(__file__).resolve().parent / "templates"
CONFIG_TEMPLATE = TEMPLATES / "spec_config.h.jinja"
_INT = re.compile(r"^-?\d+$")


@functools.lru_cache(maxsize=1)
def _environment():
    import jinja2  # imported on first render only: the warm load path never renders

    return jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


def axis_context(spec: Specialisation, tables: dict) -> list[dict]:
    out = []
    for name, value in spec.params:
        if name in tables:
            out.append({"name": name, "value": value, "kind": "type", "cpp": tables[name][value]})
        elif value in ("true", "false"):
            out.append({"name": name, "value": value, "kind": "bool"})
        elif _INT.match(value):
            out.append({"name": name, "value": value, "kind": "int"})
        else:
            out.append({"name": name, "value": value, "kind": "str"})
    return out


def render_template(path: Path, context: dict) -> str:
    return _environment().from_string(Path(path).read_text()).render(**context)


def context(spec: Specialisation, tables: dict) -> dict:
    return {
        "label": spec.target.label,
        "uri": spec.uri,
        "params": spec.param_dict,
        "axes": axis_context(spec, tables),
    }


def render(spec: Specialisation, tables: dict, units: list[Path], out_dir: Path) -> list[Path]:
    """Write the specialisation's rendered files and copied units into `out_dir`; returns the
    paths it wrote or found up to date."""
    ctx = context(spec, tables)
    written = []
    for template in [CONFIG_TEMPLATE, *(spec.target.package_dir / t for t in spec.target.templates)]:
        dest = out_dir / template.name.removesuffix(".jinja")
        write_if_different(dest, render_template(template, ctx))
        written.append(dest)
    for unit in units:
        dest = out_dir / unit.name
        write_if_different(dest, unit.read_bytes())
        written.append(dest)
    if spec.target.entries:
        from .binding import render_binding

        has_dtype = any(a["name"] == "dtype" and a["kind"] == "type" for a in ctx["axes"])
        dest = out_dir / binding_unit(spec.target)
        write_if_different(dest, render_binding(spec.target, has_dtype))
        written.append(dest)
    return written


def binding_unit(target) -> str:
    """The file name of the launcher generated from `target`'s entries."""
    return f"{target.name}_binding.cc"


def template_inputs(spec: Specialisation) -> list[Path]:
    """The files whose bytes determine what render() writes (for the cache key): with entries, the
    BUILD file declaring them and the generator too."""
    here = Path(__file__).resolve()
    generated = ([spec.target.build_file, here.with_name("binding.py"), here.with_name("entries.py")]
                 if spec.target.entries else [])
    return [here, CONFIG_TEMPLATE, *(spec.target.package_dir / t for t in spec.target.templates),
            *generated]
