// The seam digest (DESIGN.md §5, twin `twins/digest.rs`): the wrapping u64 sum over elements of
// splitmix64((global index << 32) | bits). Wrapping addition is associative and commutative, so
// per-thread sums, a block tree and one atomicAdd per block into the ticket's slot give the
// host's value whatever the order — the digest is deterministic by construction.

#ifndef MEMRA_CANON_CUH
#include "canon.cuh"
#endif

#define DIGEST_THREADS 256
// Values a thread loads before it hashes the first: a loop that hashes each value as it arrives
// waits a memory round trip per value (8 of them for a DIGEST_BATCH_CHUNK chunk). The wrapping sum
// is order-free, so moving the loads changes no digest. ncu on one H100 (step, b1): the batched
// digest 7.10 → 4.60 µs per launch (docs/gpu/2026-12-05-loads/).
#define DIGEST_LOADS 8

__device__ __forceinline__ u64 splitmix64_c(u64 x) {
    u64 z = x + 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The digest terms of x[i] for i = first, first + stride, … below end (global index base + i),
// DIGEST_LOADS values loaded before the first is hashed.
__device__ __forceinline__ u64 digest_range(const float* x, u32 first, u32 end, u32 stride, u64 base) {
    u64 acc = 0;
    for (u32 i0 = first; i0 < end; i0 += DIGEST_LOADS * stride) {
        u32 bits[DIGEST_LOADS];
#pragma unroll
        for (int j = 0; j < DIGEST_LOADS; ++j) {
            const u32 i = i0 + j * stride;
            bits[j] = i < end ? __float_as_uint(x[i]) : 0u;
        }
#pragma unroll
        for (int j = 0; j < DIGEST_LOADS; ++j) {
            const u32 i = i0 + j * stride;
            if (i < end) acc += splitmix64_c(((base + (u64)i) << 32) | (u64)bits[j]);
        }
    }
    return acc;
}

// *slot += the block's sum of every thread's `acc` (the warp butterfly, then thread 0 over the
// warps and one atomicAdd). Every thread of the block calls it.
__device__ __forceinline__ void digest_block_add(u64 acc, u64* slot) {
    __shared__ u64 warp_sums[DIGEST_THREADS / 32];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(MEMRA_FULL_MASK, acc, o);
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) warp_sums[warp] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 total = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += warp_sums[w];
        atomicAdd(slot, total);
    }
}

// *slot += digest of x[0..n) whose first element has global index `base` (slot zeroed by the
// runtime before the step).
extern "C" __global__ void __launch_bounds__(DIGEST_THREADS)
    digest_f32(const float* x, int n, u64 base, u64* slot) {
    kernel_entry();
    const u64 acc = digest_range(x, blockIdx.x * blockDim.x + threadIdx.x, n > 0 ? (u32)n : 0u,
                                 gridDim.x * blockDim.x, base);
    digest_block_add(acc, slot);
}

// ---- Batched seam digests: every part a rank holds of a layer's seams in ONE launch.
// Why: a launch per part cost more than the gated layer itself. Part p is `blocks[p]` blocks of
// n[p] values (block i at ptr + i * pitch[p] elements, global base base[p] + i * base_pitch[p]),
// added into the u64 slot at address slot[p]; with ids[p] != 0 a block counts only when the
// rank owns routed slot first_slot[p] + i under the owner rule (twins::experts::OwnerRule), so
// expert-parallel owners digest exactly the slots the route gave them. Every block of the grid
// handles one DIGEST_BATCH_CHUNK-value chunk of one block of one part (chunk_start is the prefix
// sum of the parts' chunk counts). Order-free like digest_f32: the batch changes launches,
// never a digest.
#define DIGEST_BATCH_MAX 32
#define DIGEST_BATCH_CHUNK 2048

struct DigestBatch {
    u64 ptr[DIGEST_BATCH_MAX];
    u64 base[DIGEST_BATCH_MAX];
    u64 base_pitch[DIGEST_BATCH_MAX];
    u64 slot[DIGEST_BATCH_MAX];
    u64 ids[DIGEST_BATCH_MAX];
    u32 n[DIGEST_BATCH_MAX];
    u32 blocks[DIGEST_BATCH_MAX];
    u32 pitch[DIGEST_BATCH_MAX];
    u32 first_slot[DIGEST_BATCH_MAX];
    u32 o_experts[DIGEST_BATCH_MAX];
    u32 o_div[DIGEST_BATCH_MAX];
    u32 o_mod[DIGEST_BATCH_MAX];
    u32 o_want[DIGEST_BATCH_MAX];
    u32 chunk_start[DIGEST_BATCH_MAX + 1];
    u32 count;
};

extern "C" __global__ void __launch_bounds__(DIGEST_THREADS) digest_batch_f32(const DigestBatch batch) {
    kernel_entry();
    const u32 b = blockIdx.x;
    int p = 0;
    while (p + 1 < (int)batch.count && batch.chunk_start[p + 1] <= b) ++p;
    if (p >= (int)batch.count || b >= batch.chunk_start[p + 1]) return;  // block-uniform
    const u32 n = batch.n[p];
    const u32 per_block = (n + DIGEST_BATCH_CHUNK - 1) / DIGEST_BATCH_CHUNK;
    const u32 local = b - batch.chunk_start[p];
    const u32 blk = local / per_block;
    const u32 chunk = local - blk * per_block;
    if (batch.ids[p] != 0ull) {
        const float* ids = reinterpret_cast<const float*>(batch.ids[p]);
        const u32 id = __float_as_uint(ids[batch.first_slot[p] + blk]);
        const u32 ex = batch.o_experts[p];
        const u32 dv = batch.o_div[p];
        const u32 md = batch.o_mod[p];
        if (id >= ex || dv == 0u || md == 0u || (id / dv) % md != batch.o_want[p]) return;
    }
    const float* x = reinterpret_cast<const float*>(batch.ptr[p]) + (size_t)blk * batch.pitch[p];
    const u64 base = batch.base[p] + (u64)blk * batch.base_pitch[p];
    const u32 lo = chunk * DIGEST_BATCH_CHUNK;
    const u32 hi = min(n, lo + DIGEST_BATCH_CHUNK);
    const u64 acc = digest_range(x, lo + threadIdx.x, hi, blockDim.x, base);
    digest_block_add(acc, reinterpret_cast<u64*>(batch.slot[p]));
}
