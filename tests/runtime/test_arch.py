"""Arch-list parsing, formatting, and restriction to a target's families."""

import pytest

from kiln.runtime.arch import (
    Arch,
    ArchContext,
    ArchError,
    ArchFamily,
    format_arch_list,
    parse_arch,
    parse_arch_list,
)

FAMILIES = (ArchFamily("sm80", ("8.0", "8.6", "8.7", "8.9")), ArchFamily("sm90", ("9.0",)))
HOPPER_ONLY = (ArchFamily("sm90", ("9.0",), arch_specific=True),)


@pytest.mark.parametrize("text,expected", [
    ("8.0", Arch(8, 0)), ("9.0a", Arch(9, 0, "a")), ("sm_90a", Arch(9, 0, "a")),
    ("sm90", Arch(9, 0)), ("90a", Arch(9, 0, "a")), ("100a", Arch(10, 0, "a")),
    ("10.0f", Arch(10, 0, "f")), ("compute_86", Arch(8, 6)), ("9.0+PTX", Arch(9, 0, "", True)),
    (" 12.0 ", Arch(12, 0)),
])
def test_parse_arch_accepts_every_spelling(text, expected):
    assert parse_arch(text) == expected


@pytest.mark.parametrize("text", ["9", "sm_", "9.0b", "ampere", "8.0.1", ""])
def test_parse_arch_rejects_garbage_with_the_spellings_it_accepts(text):
    with pytest.raises(ArchError, match="write it as '9.0', '9.0a'"):
        parse_arch(text)


@pytest.mark.parametrize("text", ["8.0 9.0a", "8.0;9.0a", "9.0a,8.0", "sm_80 sm_90a", " 8.0 ;; 9.0a "])
def test_parse_arch_list_separators_order_and_duplicates(text):
    assert parse_arch_list(text) == (Arch(8, 0), Arch(9, 0, "a"))
    assert format_arch_list(parse_arch_list(text)) == "8.0 9.0a"


def test_gencode_flags():
    assert Arch(9, 0, "a").gencode() == "-gencode=arch=compute_90a,code=[sm_90a]"
    assert Arch(8, 0, ptx=True).gencode() == "-gencode=arch=compute_80,code=[sm_80,compute_80]"


def test_restrict_keeps_supported_archs_only():
    ctx = ArchContext(parse_arch_list("7.5 8.0 8.9 9.0 10.0"), "test")
    assert ctx.restrict(FAMILIES, "//ops:x") == (Arch(8, 0), Arch(8, 9), Arch(9, 0))


def test_restrict_upgrades_9_0_to_9_0a_when_the_target_needs_hopper_features():
    ctx = ArchContext(parse_arch_list("8.0 9.0"), "test")
    assert ctx.restrict(HOPPER_ONLY, "//ops:hopper") == (Arch(9, 0, "a"),)


def test_restrict_honours_an_explicit_9_0a_for_a_generic_target():
    ctx = ArchContext(parse_arch_list("9.0a"), "test")
    assert ctx.restrict(FAMILIES, "//ops:x") == (Arch(9, 0, "a"),)


def test_restrict_fails_clearly_when_nothing_is_supported():
    ctx = ArchContext(parse_arch_list("7.5 10.0"), "KILN_CUDA_ARCH_LIST='7.5 10.0'")
    with pytest.raises(ArchError) as e:
        ctx.restrict(HOPPER_ONLY, "//ops:hopper")
    msg = str(e.value)
    assert "//ops:hopper supports none of the requested CUDA archs [7.5 10.0]" in msg
    assert "KILN_CUDA_ARCH_LIST='7.5 10.0'" in msg  # the arch list in force
    assert "sm90a (9.0)" in msg  # the families supported


def test_restrict_with_no_device_and_no_list_says_how_to_fix_it():
    with pytest.raises(ArchError, match="set KILN_CUDA_ARCH_LIST"):
        ArchContext((), "detected devices: none").restrict(FAMILIES, "//ops:x")


def test_context_precedence(kiln_env):
    kiln_env.set("KILN_CUDA_ARCH_LIST", "8.6")
    assert ArchContext.current().requested == (Arch(8, 6),)
    assert "KILN_CUDA_ARCH_LIST" in ArchContext.current().source
    assert ArchContext.current("9.0a").requested == (Arch(9, 0, "a"),)  # --arch-list wins
    kiln_env.set("KILN_CUDA_ARCH_LIST", "bogus")
    with pytest.raises(ArchError):
        ArchContext.current()
