// Function qualifiers shared by code compiled for the device and for the host.
#pragma once

#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define KILN_HOST_DEVICE inline
#endif
