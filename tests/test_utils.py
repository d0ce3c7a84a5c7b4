"""kiln.utils' programmatic-dependent-launch queries (FlashInfer's names): what enable_pdl resolves
to, on CPU tensors, on a CUDA device kiln cannot query, and on the local GPU."""

import pytest
import torch

from kiln import utils


@pytest.mark.parametrize("asked", [None, True, False])
def test_cpu_tensors_never_launch_with_pdl(asked):
    assert utils.use_pdl(asked, torch.device("cpu")) is False
    assert utils.device_support_pdl(torch.device("cpu")) is False
    assert utils.is_sm90a_supported(torch.device("cpu")) is False


@pytest.mark.parametrize("bad", [1, "yes", 0.0])
def test_enable_pdl_that_is_not_a_bool_is_a_type_error(bad):
    with pytest.raises(TypeError, match=f"enable_pdl must be a bool or None, got {type(bad).__name__}"):
        utils.use_pdl(bad, torch.device("cpu"))


@pytest.mark.skipif(utils.cuda_available(), reason="the case of a machine without CUDA")
def test_a_cuda_device_without_a_cuda_runtime_has_no_pdl():
    """torch.compile traces fake CUDA tensors on machines without a GPU: the query answers False
    (a constant of the graph) rather than torch's "not compiled with CUDA"."""
    assert utils.use_pdl(None, torch.device("cuda")) is False
    assert utils.use_pdl(True, torch.device("cuda", 0)) is False


@pytest.mark.gpu
def test_the_local_gpu_has_pdl_from_sm90():
    device = torch.device("cuda")
    major, minor = utils.get_compute_capability(device)
    assert utils.device_support_pdl(device) is (major >= 9)
    assert utils.use_pdl(None, device) is (major >= 9) and utils.use_pdl(False, device) is False
    assert utils.is_sm90a_supported(device) is ((major, minor) == (9, 0))


def test_modules_by_position_are_module_s_and_say_which_argument_is_wrong():
    """_jit.Modules (the hot call sites' lookup by position) returns module()'s module and, for a
    dtype the target lacks, module()'s error naming the argument."""
    from kiln import _jit

    rows = _jit.Modules("//ops:norm", "dtype", names={"dtype": "input.dtype"})
    cpu = torch.device("cpu")
    found = rows.get("kiln.rmsnorm", cpu, torch.float32)
    assert found is _jit.module("//ops:norm", cpu, "kiln.rmsnorm", dtype=torch.float32)
    assert rows.get("kiln.rmsnorm", cpu, torch.float32) is found
    with pytest.raises(TypeError, match=r"kiln.rmsnorm: input.dtype int32 is not supported"):
        rows.get("kiln.rmsnorm", cpu, torch.int32)
