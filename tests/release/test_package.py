"""The artifact set and the wheel `python -m release` writes: reproducible, installable by pip's
rules (RECORD, entry point), nothing in them that could lead outside; `verify` catches tampering;
`pin` records manifest digests."""

import base64
import hashlib
import json
import zipfile

import pytest
from precompiled_helpers import build_toy_release, host_release, manifest_digest

from kiln.runtime.manifest import MANIFEST, Manifest
from release import cli, verify, wheel


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    return build_toy_release(tmp_path_factory.mktemp("pkg-release"))[1]


def manifest_of(staged) -> Manifest:
    return Manifest.from_bytes((staged / MANIFEST).read_bytes(), "test")


def test_the_wheel_is_reproducible_and_well_formed(staged, tmp_path):
    a = wheel.write_wheel(staged, manifest_of(staged), tmp_path / "a")
    b = wheel.write_wheel(staged, manifest_of(staged), tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()
    with zipfile.ZipFile(a) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/RECORD")).rsplit("/", 1)[0]
        assert z.read(f"{info}/entry_points.txt").decode() == \
            "[kiln.precompiled]\nhost = kiln_precompiled_host\n"
        for row in z.read(f"{info}/RECORD").decode().splitlines():
            name, digest, size = row.split(",")
            if name.endswith("RECORD"):
                continue
            data = z.read(name)
            expect = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={expect}" and int(size) == len(data), name
    assert verify.verify_wheel(a) == (manifest_of(staged), [])


def _rewrite(src, dest, change):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dest, "w") as zout:
        for item in zin.infolist():
            change(zout, item, zin.read(item.filename))


def test_verify_catches_a_tampered_module_an_escaping_name_and_a_link(staged, tmp_path):
    whl = wheel.write_wheel(staged, manifest_of(staged), tmp_path)

    def tamper(z, item, data):
        z.writestr(item, data[:-1] + b"\1" if item.filename.endswith(".so") else data)

    _rewrite(whl, tmp_path / "tampered.whl", tamper)
    _, problems = verify.verify_wheel(tmp_path / "tampered.whl")
    assert problems == ["toy_module: toy_module/" + manifest_of(staged).modules[0].file.split("/")[1]
                        + " does not match its recorded size and SHA-256"]

    def escape(z, item, data):
        z.writestr(item, data)
        if item.filename.endswith("METADATA"):
            z.writestr("../evil.py", b"")
            link = zipfile.ZipInfo("kiln_precompiled_host/link.so")
            link.external_attr = 0o120777 << 16
            z.writestr(link, "/bin/sh")

    _rewrite(whl, tmp_path / "escape.whl", escape)
    _, problems = verify.verify_wheel(tmp_path / "escape.whl")
    assert any("refusing file name '../evil.py'" in p for p in problems)
    assert any("link.so is a symbolic link" in p for p in problems)


def test_pin_records_the_manifest_digest(staged, tmp_path, monkeypatch):
    pins = tmp_path / "pins.json"
    monkeypatch.setattr(cli, "PINS", pins)
    repo_root = staged.parents[2]  # <root>/<version>/<tag>/<abi>
    assert cli.main(["pin", str(repo_root)]) == 0
    assert json.loads(pins.read_text()) == {host_release().path: manifest_digest(staged)}
    assert cli.main(["verify", str(staged)]) == 0
