"""Manifests of precompiled modules: names that could escape their directory and links are
refused, fields are type-checked, and recorded keys must agree with what they are made of; and
which archs a module's SASS serves."""

import json

import pytest

from kiln.runtime.arch import (
    arch_list_tag,
    parse_arch,
    parse_arch_list,
    parse_arch_list_tag,
    runs_on,
    uncovered,
)
from kiln.runtime.key import portable_action_key, spec_key
from kiln.runtime.manifest import Manifest, ManifestError, resolve_inside, safe_relpath


@pytest.mark.parametrize("name", ["mod/lib.so", "a/b/c.so", "lib.so"])
def test_relative_names_inside_the_directory_are_accepted(name):
    assert safe_relpath(name, "test") == name


@pytest.mark.parametrize("name,why", [
    ("../lib.so", "'..'"), ("a/../../lib.so", "'..'"), ("/etc/lib.so", "an absolute path"),
    ("C:/lib.so", "an absolute path"), ("a\\..\\lib.so", "a backslash"), ("a//lib.so", "an empty"),
    ("./lib.so", "'.' part"), ("", "non-empty string"), (None, "non-empty string"),
])
def test_names_that_could_escape_are_refused(name, why):
    with pytest.raises(ManifestError, match=why):
        safe_relpath(name, "manifest.json")


def test_links_anywhere_on_the_way_are_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "lib.so").write_bytes(b"x")
    assert resolve_inside(tmp_path, "real/lib.so", "t") == tmp_path / "real" / "lib.so"
    (tmp_path / "linkdir").symlink_to(tmp_path / "real")
    with pytest.raises(ManifestError, match="linkdir: it is a symbolic link"):
        resolve_inside(tmp_path, "linkdir/lib.so", "t")
    (tmp_path / "real" / "link.so").symlink_to("/bin/sh")
    with pytest.raises(ManifestError, match="link.so: it is a symbolic link"):
        resolve_inside(tmp_path, "real/link.so", "t")
    with pytest.raises(FileNotFoundError):
        resolve_inside(tmp_path, "real/missing.so", "t")


def _manifest(**module_changes) -> dict:
    parts = {"module": "m", "kiln_version": "1.0.0"}
    sources = {"ops/x.h": "a" * 64}
    pk = spec_key(parts)
    module = {"module": "m", "uri": "m", "label": "//ops:m", "params": {}, "file": "m/m.so",
              "sha256": "b" * 64, "size": 3, "archs": [], "kiln_version": "1.0.0",
              "python_abi": "abi", "toolchain": {"name": "host"}, "portable_parts": parts,
              "portable_key": pk, "sources": sources,
              "portable_action_key": portable_action_key(pk, sources), "spec_key": "s",
              "action_key": "a"}
    module.update(module_changes)
    return {"format": 1, "kiln_version": "1.0.0", "python_abi": "abi", "toolchain": "host",
            "arch_list": "", "created_at": 0, "modules": [module]}


def test_a_well_formed_manifest_reads_back_identically():
    m = Manifest.from_bytes(json.dumps(_manifest()).encode(), "t")
    assert Manifest.from_bytes(m.to_bytes(), "t") == m and m.entries("m")[0].size == 3


@pytest.mark.parametrize("changes,match", [
    ({"file": "../m.so"}, "refusing file name"),
    ({"sha256": "xyz"}, "not a SHA-256"),
    ({"size": "3"}, "size must be int"),
    ({"portable_key": "0" * 64}, "portable_key does not match"),
    ({"sources": {"ops/x.h": "c" * 64}}, "portable_action_key does not match"),
    ({"sources": {"../x.h": "a" * 64}}, "refusing file name"),
    ({"kiln_version": "2.0.0"}, "is for kiln 2.0.0 .* the manifest for kiln 1.0.0"),
    ({"module": "not-an-identifier"}, "not an identifier"),
])
def test_malformed_or_inconsistent_entries_are_refused(changes, match):
    with pytest.raises(ManifestError, match=match):
        Manifest.from_bytes(json.dumps(_manifest(**changes)).encode(), "t")


def test_other_formats_and_junk_are_refused():
    with pytest.raises(ManifestError, match="has format 2"):
        Manifest.from_bytes(json.dumps({**_manifest(), "format": 2}).encode(), "t")
    with pytest.raises(ManifestError, match="not valid JSON"):
        Manifest.from_bytes(b"{nope", "t")


@pytest.mark.parametrize("built,device,ok", [
    ("8.0", "8.0", True), ("8.0", "8.6", True), ("8.0", "8.9", True), ("8.6", "8.0", False),
    ("8.0", "9.0", False), ("9.0a", "9.0", True), ("9.0a", "9.1", False), ("10.0f", "10.3", True),
    ("12.0", "10.0", False),
])
def test_which_device_sass_runs_on(built, device, ok):
    assert runs_on(parse_arch(built), parse_arch(device)) is ok


def test_a_module_covers_a_plan_only_with_code_for_each_wanted_arch():
    built = parse_arch_list("8.0 9.0a")
    assert uncovered(built, parse_arch_list("8.6 9.0")) == []
    assert uncovered(built, parse_arch_list("9.0a")) == []
    assert uncovered(parse_arch_list("9.0"), parse_arch_list("9.0a")) == [parse_arch("9.0a")]
    assert uncovered(built, parse_arch_list("10.0")) == [parse_arch("10.0")]
    assert uncovered(built, parse_arch_list("9.0+PTX")) == [parse_arch("9.0+PTX")]


def test_arch_list_tags_round_trip():
    archs = parse_arch_list("9.0a 8.0 10.0+PTX")
    assert arch_list_tag(archs) == "sm80-sm90a-sm100+ptx"
    assert parse_arch_list_tag("sm80-sm90a-sm100+ptx") == archs
