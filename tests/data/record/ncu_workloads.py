"""CUDA kernels of known character, for recording real Nsight Compute outputs.

Each kernel below has one planted property; the ncu outputs recorded from this program are
committed under ``tests/data/ncu/`` and the verdicts proflab derives from them are tested.
The kernels are compiled at run time with NVRTC (``torch.cuda._compile_kernel``) so that the
program needs nothing beyond PyTorch.

Every kernel runs once un-profiled (module load, cuBLAS handles, caches) and then once inside
``cudaProfilerStart``/``cudaProfilerStop``, so ``ncu --profile-from-start off`` profiles
exactly one launch of each.

pf_stream_triad      memory-bound: a[i] = b[i] + s * c[i] over 3 x 256 MiB, coalesced.
pf_tiny              latency-bound: one block of 32 threads doing one add each.
pf_fma_heavy         compute-bound on the FP32 pipe: long chains of independent FMAs.
pf_smem_limited      occupancy limited by shared memory: 160 KiB of dynamic shared memory
                     per 128-thread block, so one block (4 warps) per SM.
pf_regs_heavy        occupancy limited by registers: 64 live accumulators per thread.
pf_strided           uncoalesced: each thread of a warp reads a different 128-byte line.
pf_bank_conflict     32-way shared-memory bank conflicts: column access to a 32 x 32 tile.
pf_divergent         divergence: odd and even lanes of each warp take different loops.
bf16 GEMM            tensor cores: torch.matmul of two 8192 x 8192 bf16 matrices.
fp32 GEMM            FP32 SIMT GEMM (TF32 off): no tensor cores.
pf_spill             local memory: a 256-float per-thread array indexed at run time, so it
                     lives in local memory (1 KiB per thread) and every access is an LDL/STL;
                     each lane of a warp picks a different element, so the local accesses are
                     scattered too. Not in the default list: recorded on its own
                     (``--only pf_spill``, the ``spill_*`` captures), so the ``workloads_*``
                     captures keep the ten kernels they were recorded with.

Usage::

    python tests/data/record/ncu_workloads.py            # under ncu --profile-from-start off
    python tests/data/record/ncu_workloads.py --only pf_tiny pf_strided
    python tests/data/record/ncu_workloads.py --only pf_spill
"""

from __future__ import annotations

import argparse
import sys

import torch

SRC = r"""
extern "C" __global__ void pf_stream_triad(float* a, const float* b, const float* c, double s, int n) {
    float sf = (float)s;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        a[i] = b[i] + sf * c[i];
}

extern "C" __global__ void pf_tiny(float* a) {
    a[threadIdx.x] += 1.0f;
}

extern "C" __global__ void pf_fma_heavy(float* out, int iters) {
    float x0 = threadIdx.x, x1 = x0 + 1, x2 = x0 + 2, x3 = x0 + 3;
    float x4 = x0 + 4, x5 = x0 + 5, x6 = x0 + 6, x7 = x0 + 7;
    const float m = 0.9999f, c = 0.0001f;
    for (int i = 0; i < iters; ++i) {
        #pragma unroll
        for (int j = 0; j < 16; ++j) {
            x0 = fmaf(x0, m, c); x1 = fmaf(x1, m, c); x2 = fmaf(x2, m, c); x3 = fmaf(x3, m, c);
            x4 = fmaf(x4, m, c); x5 = fmaf(x5, m, c); x6 = fmaf(x6, m, c); x7 = fmaf(x7, m, c);
        }
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
}

extern "C" __global__ void pf_smem_limited(float* out, const float* in, int n) {
    extern __shared__ float tile[];
    // 160 KiB of dynamic shared memory per block: only one block fits on an SM.
    int per_block = 40960;
    for (int k = threadIdx.x; k < per_block; k += blockDim.x)
        tile[k] = in[((size_t)blockIdx.x * per_block + k) % n];
    __syncthreads();
    float acc = 0.f;
    for (int k = threadIdx.x; k < per_block; k += blockDim.x)
        acc += tile[(k * 33) % per_block];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

extern "C" __global__ void pf_regs_heavy(float* out, const float* in, int iters) {
    float acc[64];
    #pragma unroll
    for (int j = 0; j < 64; ++j) acc[j] = in[(threadIdx.x + j) & 1023];
    for (int i = 0; i < iters; ++i) {
        #pragma unroll
        for (int j = 0; j < 64; ++j) acc[j] = fmaf(acc[j], acc[(j + 1) & 63], 0.5f);
    }
    float s = 0.f;
    #pragma unroll
    for (int j = 0; j < 64; ++j) s += acc[j];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

extern "C" __global__ void pf_strided(float* out, const float* in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        // neighbouring threads read addresses 32 floats (128 bytes) apart
        long long j = ((long long)i * 32) % n + ((long long)i * 32) / n;
        out[i] = in[j];
    }
}

extern "C" __global__ void pf_bank_conflict(float* out, int iters) {
    __shared__ float tile[32 * 32];
    int t = threadIdx.x & 31;
    for (int k = threadIdx.x; k < 32 * 32; k += blockDim.x) tile[k] = k;
    __syncthreads();
    float acc = 0.f;
    for (int i = 0; i < iters; ++i) {
        // column access: all 32 lanes hit the same bank
        acc += tile[t * 32 + (i & 31)];
        tile[t * 32 + ((i + 1) & 31)] = acc;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

extern "C" __global__ void pf_divergent(float* out, int iters) {
    float x = threadIdx.x;
    if (threadIdx.x & 1) {
        for (int i = 0; i < iters; ++i) x = sinf(x) * 1.0001f;
    } else {
        for (int i = 0; i < iters; ++i) x = cosf(x) * 0.9999f;
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = x;
}

extern "C" __global__ void pf_spill(float* out, const float* in, int iters) {
    // Indexed with a per-thread run-time value, the array cannot live in registers: the
    // compiler places it in local memory, 1 KiB per thread.
    float buf[256];
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    for (int k = 0; k < 256; ++k) buf[k] = in[(t + k) & 1023];
    unsigned int h = (unsigned int)t * 2654435761u;
    float acc = 0.f;
    for (int i = 0; i < iters; ++i) {
        h = h * 1664525u + 1013904223u;  // a different index in every lane
        int j = (int)(h >> 24);
        acc += buf[j];
        buf[(j + 7) & 255] = acc * 0.5f;
    }
    out[t] = acc;
}
"""

KERNELS = (
    "pf_stream_triad", "pf_tiny", "pf_fma_heavy", "pf_smem_limited", "pf_regs_heavy",
    "pf_strided", "pf_bank_conflict", "pf_divergent",
)
GEMMS = ("gemm_bf16", "gemm_fp32")
EXTRA = ("pf_spill",)  # recorded on their own, not part of the default list
SMEM_LIMITED_BYTES = 40960 * 4


def build(names: list[str]):
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    n = 1 << 26  # 64 M floats = 256 MiB per array
    a, b, c = (torch.rand(n, device="cuda") for _ in range(3))
    out = torch.empty(n, device="cuda")
    k = {name: torch.cuda._compile_kernel(SRC, name) for name in names if name.startswith("pf_")}
    if "pf_smem_limited" in k:
        k["pf_smem_limited"].set_shared_memory_config(SMEM_LIMITED_BYTES)
    runs = {
        "pf_stream_triad": lambda: k["pf_stream_triad"](grid=(sms * 16, 1, 1), block=(256, 1, 1), args=[a, b, c, 2.0, n]),
        "pf_tiny": lambda: k["pf_tiny"](grid=(1, 1, 1), block=(32, 1, 1), args=[a]),
        "pf_fma_heavy": lambda: k["pf_fma_heavy"](grid=(sms * 8, 1, 1), block=(256, 1, 1), args=[out, 2048]),
        "pf_smem_limited": lambda: k["pf_smem_limited"](grid=(sms * 4, 1, 1), block=(128, 1, 1), args=[out, b, n], shared_mem=SMEM_LIMITED_BYTES),
        "pf_regs_heavy": lambda: k["pf_regs_heavy"](grid=(sms * 8, 1, 1), block=(256, 1, 1), args=[out, b, 256]),
        "pf_strided": lambda: k["pf_strided"](grid=(n // 256, 1, 1), block=(256, 1, 1), args=[out, b, n]),
        "pf_bank_conflict": lambda: k["pf_bank_conflict"](grid=(sms * 8, 1, 1), block=(256, 1, 1), args=[out, 4096]),
        "pf_divergent": lambda: k["pf_divergent"](grid=(sms * 8, 1, 1), block=(256, 1, 1), args=[out, 512]),
        "pf_spill": lambda: k["pf_spill"](grid=(sms * 4, 1, 1), block=(256, 1, 1), args=[out, b, 2048]),
    }
    if set(names) & set(GEMMS):
        x16 = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        x32 = torch.randn(4096, 4096, device="cuda", dtype=torch.float32)
        runs["gemm_bf16"] = lambda: torch.matmul(x16, x16)
        runs["gemm_fp32"] = lambda: torch.matmul(x32, x32)
    return [runs[name] for name in names]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="+", choices=KERNELS + GEMMS + EXTRA, default=list(KERNELS + GEMMS))
    args = p.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    fns = build(args.only)
    for fn in fns:  # warm-up, outside the capture range
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"ran {len(fns)} kernels", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
