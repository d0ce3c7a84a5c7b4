"""Root of kiln's build graph.

Plain data, read by `kiln.codegen.workspace` (it is executed in an empty namespace and must import
nothing of kiln). It names:
  - where BUILD files live,
  - the GPU architecture families a target may declare, and the compute capabilities in each,
  - the dispatch-axis value tables (dtype short name -> C++ type) shared by every op,
  - the toolchains and their base flags, and the triton spelling of the dtype axis values,
  - the architecture list that release packages are built for.
"""

# Directories (relative to this file) searched recursively for BUILD.py files.
BUILD_ROOTS = ("ops",)

# GPU architecture families. A target lists the families it supports in `archs=`; the arch context
# restricts every CUDA build to those families and refuses the rest. A family name with
# an "a" suffix in a target's list ("sm90a") means the target uses arch-specific instructions
# (wgmma, setmaxnreg): a requested 9.0 is then compiled as 9.0a, which runs only on 9.0 devices.
ARCH_FAMILIES = {
    "sm80": {
        "archs": ("8.0", "8.6", "8.7", "8.9"),
        "about": "Ampere and Ada: mma.sync, ldmatrix, cp.async, bf16",
    },
    "sm90": {
        "archs": ("9.0",),
        "about": "Hopper: adds TMA and thread-block clusters; wgmma with the 9.0a variant",
    },
    "sm100": {
        "archs": ("10.0", "10.3"),
        "about": "Blackwell data-centre (B200, GB300)",
    },
    "sm120": {
        "archs": ("12.0", "12.1"),
        "about": "Blackwell workstation and consumer (RTX PRO 6000, RTX 50xx, DGX Spark)",
    },
}

# Dispatch-axis value tables: one table per axis kind, in one place. Codegen turns an
# axis value into the C++ spelling here when it renders a specialisation's config header; the
# C++ names come from ops/common/dtypes.h, which maps them to CUDA or portable host types.
AXIS_TABLES = {
    "dtype": {
        "f32": "float",
        "f16": "kiln::f16_t",
        "bf16": "kiln::bf16_t",
        "e4m3": "kiln::e4m3_t",  # fp8 E4M3 "fn" (torch.float8_e4m3fn): GEMM inputs
        "e5m2": "kiln::e5m2_t",  # fp8 E5M2 (torch.float8_e5m2)
    },
    # The element type of a paged KV cache: the query's 16-bit type, or fp8 E4M3 with per-tensor
    # k_scale / v_scale (attention's decode and page targets).
    "kv_dtype": {
        "f16": "kiln::f16_t",
        "bf16": "kiln::bf16_t",
        "e4m3": "kiln::e4m3_t",
    },
}

# Toolchains: one spec interface for every compiler. Flags here are the base flags of every
# module built with the toolchain; a target adds its own `cflags` / `cuda_flags` / `ldflags`.
TOOLCHAINS = {
    "host": {
        "about": "the C++ compiler (CXX, else c++/g++): the CPU backend of every op",
        "cxx_flags": ("-O3", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-DNDEBUG"),
        "debug_cxx_flags": ("-O0", "-g", "-std=c++17", "-fPIC", "-fvisibility=hidden"),
        # KILN_JIT_ASAN=1: added to the compile and link flags of every host module (a separate
        # build with its own cache key). Loading one needs the ASan runtime preloaded
        # (LD_PRELOAD=$(c++ -print-file-name=libasan.so); docs/env.md).
        "asan_flags": ("-fsanitize=address", "-fno-omit-frame-pointer"),
    },
    "cuda": {
        "about": "nvcc (KILN_NVCC, else CUDA_HOME/bin/nvcc, else nvcc on PATH) for device code",
        "cxx_flags": ("-O3", "-std=c++17", "-fPIC", "-fvisibility=hidden", "-DNDEBUG"),
        "debug_cxx_flags": ("-O0", "-g", "-std=c++17", "-fPIC", "-fvisibility=hidden"),
        "cuda_flags": (
            "-O3",
            "-std=c++17",
            "-DNDEBUG",
            "--expt-relaxed-constexpr",
            "-Xcompiler=-fPIC,-fvisibility=hidden",
        ),
        "debug_cuda_flags": (
            "-O0",
            "-g",
            "-G",
            "-std=c++17",
            "--expt-relaxed-constexpr",
            "-Xcompiler=-fPIC,-fvisibility=hidden",
        ),
        # cudart is linked statically: a module then needs no libcudart on the loader path, and it
        # shares the driver's primary context (and so pointers and streams) with the framework.
        "ldflags": ("-lcudart_static", "-ldl", "-lrt", "-lpthread"),
    },
    "triton": {
        "about": "the triton package (3.6) of this Python: @triton.jit kernels to one cubin per "
                 "kernel and arch, launched through the CUDA driver (no flags: a kernel's "
                 "options are its triton_kernel(num_warps=, num_stages=))",
    },
}

# A dispatch-axis value's triton spelling, substituted into triton_kernel signatures ("*{dtype}").
TRITON_TYPES = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "e4m3": "fp8e4nv", "e5m2": "fp8e5"}

# Release packages are built for exactly this list; `python -m release build --arch-list`
# may name another.
RELEASE_ARCH_LIST = "8.0 8.9 9.0a 10.0 12.0"
