# //ops:comm -- intra-node all-reduce over CUDA IPC buffers: one-shot and two-shot all-reduce and
# the fused all-reduce + residual + RMSNorm (ops/comm/comm.cuh), with the buffer and IPC-handle
# helpers the binding exposes. CUDA only: CPU tensors use kiln.comm's shared-memory host backend,
# which needs no kernel. One module per dtype (comm_dtype_bf16_cuda, ...).
op_library(
    name="comm",
    doc="all-reduce over CUDA IPC buffers (one-shot, two-shot) and all-reduce + residual + RMSNorm",
    srcs=["comm_cuda.cu"],
    binding="bindings/comm.cc",
    dispatch={"dtype": ["f32", "f16", "bf16"]},
    archs=["sm80", "sm90", "sm100", "sm120"],
    release=no_release("collectives are built on first use: no multi-GPU machine has measured them yet"),
)
