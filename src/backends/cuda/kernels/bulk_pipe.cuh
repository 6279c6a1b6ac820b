// The bulk-copy pipeline core (nvcc only, sm_90): a ring of shared-memory stages filled by 1-D bulk
// asynchronous copies (`cp.async.bulk`, the copy engine moves whole contiguous runs: no tensor map, no
// per-lane addresses) and handed between one producer warp and the consumer warps with mbarriers.
//
// Why: a decode product streams each weight byte once, so the card is fed only when ~3 MB are in flight
// (~25-32 KB per multiprocessor at ~4.2 TB/s and ~0.7 us latency). Per-lane 16-byte cp.async rings kept too
// few bytes in flight per warp; one bulk copy moves a 16-64 KB stage and holds no registers while it flies.
//
// Protocol of one ring of S stages (stage i of the block's sequence lives in slot i % S, round i / S):
//   full[slot]  count 1: the producer's arrive.expect_tx(bytes); the copies' complete_tx bring the
//               transaction count back to zero, and the phase completes when both happened (in any order).
//   empty[slot] count = consumer warps: each consumer warp arrives once when it is done reading the slot.
// The producer waits empty[slot] with parity (round & 1) ^ 1 (round 0 passes at once: a fresh barrier
// counts its phase "-1" as complete), then arms full[slot] and issues the copies; a consumer waits
// full[slot] with parity round & 1. A barrier phase can never run two rounds ahead: the producer cannot
// re-arm full[slot] before every consumer warp released the slot, and it cannot pass empty[slot] before
// the consumers waited for the data, so parity (one bit) is enough.
// The consumers read the stage with ordinary (generic-proxy) loads and the next copy into the slot writes
// through the async proxy: each consumer thread issues fence.proxy.async.shared::cta before its warp
// releases the slot (the PTX memory model orders generic accesses before async-proxy ones only through it).
#pragma once

#include <cstdint>

#include "backends/cuda/kernels/stream_tile.cuh"

namespace tern::cuda::dev {

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}

// Makes the initialised barriers visible to the async proxy (the copy engine's complete_tx); a block is a
// cluster of one, so the cluster-scope form is the one PTX offers. Follow with __syncthreads().
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Arrives once and adds `bytes` to the phase's expected transaction count.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      " .reg .pred p;\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.b32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}

// Waits until the phase of parity `parity` has completed (acquire: the stage's bytes are visible after).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// `bytes` (a multiple of 16) from global `src` (16-byte aligned) to shared `dst` (16-byte aligned),
// completing on `bar` as transaction bytes.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar))
      : "memory");
}

// The same to the same shared-memory offset in every block of the cluster whose bit is set in `cta_mask` (each
// block's barrier at `bar`'s offset gets the transaction bytes of its copy): a block of a cluster loads its share of an
// operand all of them use and the copy engine delivers it to each.
__device__ __forceinline__ void bulk_copy_g2s_multicast(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                                        uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "h"(cta_mask)
      : "memory");
}

// The 32-bit shared::cluster address of `p` (this block's shared memory) in the cluster block `rank`: one register an
// address where the generic pointers of cluster_group::map_shared_rank take two.
__device__ __forceinline__ uint32_t cluster_smem_addr(const void* p, uint32_t rank) {
  uint32_t r;
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr(p)), "r"(rank));
  return r;
}

// An arrival on a barrier of another block of the cluster (its shared::cluster address), with mbarrier.arrive's
// default semantics (release at CTA scope), as the consumer release of a multicast ring needs: what it orders is this
// block's reads of a slot (done, waited for) before the peer's copy engine writes it. Session 36: .release.cluster here
// and .acquire.cluster on the producer's wait cost a fence (ERRBAR) and an L1 invalidation (CCTL.IVALL) each, 36% of
// the samples of the multicast up kernel.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t cluster_addr) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_addr) : "memory");
}

// One arrival on `bar` once every cp.async (the non-bulk, per-thread form) this thread issued before it has
// landed; .noinc: the arrival is one of the barrier's expected count (BulkRing::init's producer_arrivals).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(smem_addr(bar)) : "memory");
}

// Orders this thread's earlier generic-proxy shared-memory accesses before later async-proxy ones (a bulk
// copy that overwrites what was read).
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Barrier among `threads` threads (a multiple of 32) of the block on hardware barrier `id` (1..15; 0 is
// __syncthreads): the consumer warps synchronise without the producer warp.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Shared-memory loads at a 32-bit shared address (address arithmetic stays in 32 bits).
__device__ __forceinline__ uint4 lds128_at(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ uint2 lds64_at(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds32_at(uint32_t a) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(a));
  return v;
}
// ... and stores.
__device__ __forceinline__ void sts128_at(uint32_t a, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ void sts32_at(uint32_t a, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(a), "r"(v) : "memory");
}

// The ring's barriers and the stage bookkeeping of one block (both sides walk the same stage sequence).
struct BulkRing {
  uint64_t* full;   // [stages]
  uint64_t* empty;  // [stages]
  int stages;

  // Thread 0 only, then mbar_init_fence() and __syncthreads() by the block.
  // producer_arrivals: arrivals that complete a full phase besides the transaction bytes (1: the arming
  // thread alone; more where producer threads also arrive through cp_async_mbar_arrive_noinc).
  __device__ void init(int consumer_warps, int producer_arrivals = 1) const {
    for (int s = 0; s < stages; ++s) {
      mbar_init(&full[s], static_cast<uint32_t>(producer_arrivals));
      mbar_init(&empty[s], static_cast<uint32_t>(consumer_warps));
    }
  }
  __device__ int slot(int i) const { return i % stages; }
  __device__ uint32_t round_parity(int i) const { return static_cast<uint32_t>((i / stages) & 1); }

  // Producer: waits until stage i's slot is free (its previous round released by every consumer warp).
  __device__ void wait_free(int i) const { wait_free_at(slot(i), round_parity(i)); }
  // Producer, one thread: arms stage i's slot for `bytes` of copies (issue them after, on full_bar(i)).
  __device__ void arm(int i, uint32_t bytes) const { mbar_arrive_expect_tx(&full[slot(i)], bytes); }
  __device__ uint64_t* full_bar(int i) const { return &full[slot(i)]; }
  // Consumer: waits until stage i's bytes have landed.
  __device__ void wait_full(int i) const { wait_full_at(slot(i), round_parity(i)); }
  // Consumer warp, all lanes: done reading stage i's slot (fence, then one arrival per warp).
  __device__ void release(int i) const { release_at(slot(i)); }

  // The same by (slot, round parity) of a stage, for walks that keep them in a RingCursor (no divisions).
  __device__ void wait_free_at(int s, uint32_t parity) const { mbar_wait(&empty[s], parity ^ 1u); }
  __device__ void wait_full_at(int s, uint32_t parity) const { mbar_wait(&full[s], parity); }
  __device__ void release_at(int s) const {
    fence_proxy_async_smem();
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(&empty[s]);
  }
  // A ring shared by the blocks of a cluster (each block's producer writes into the others' slots by multicast, so a
  // slot is free once every block's consumers are done with it; init with ctas x the consumer warps): release_at on
  // this block's barrier and on each other block's.
  __device__ void release_cluster_at(int s, uint32_t rank, int ctas) const {
    fence_proxy_async_smem();
    __syncwarp();
    // Lane 0 arrives here, lane r on block rank + r: the remote arrivals side by side, not one lane's chain.
    const int r = static_cast<int>(threadIdx.x & 31);
    if (r == 0)
      mbar_arrive(&empty[s]);
    else if (r < ctas)
      mbar_arrive_cluster(cluster_smem_addr(&empty[s], (rank + static_cast<uint32_t>(r)) % static_cast<uint32_t>(ctas)));
  }
};

// Stage i's slot (i % stages) and round parity ((i / stages) & 1), kept by counting while a loop walks the
// stages in order: the per-stage integer divisions by the run-time ring depth become an add and a compare.
struct RingCursor {
  int slot = 0;
  uint32_t parity = 0;
  int round = 0;  // the stage's round (stage / stages), for rings whose slots several consumer groups share
  __device__ void next(int stages) {
    if (++slot == stages) {
      slot = 0;
      parity ^= 1u;
      ++round;
    }
  }
};

// Shared-memory words read and written around the async proxy's barriers without caching in registers.
__device__ __forceinline__ int ld_volatile_shared(const int* p) { return *static_cast<const volatile int*>(p); }
__device__ __forceinline__ void st_volatile_shared(int* p, int v) { *static_cast<volatile int*>(p) = v; }

}  // namespace tern::cuda::dev

namespace tern::cuda::dev {

// A ring owned by ONE warp (linear_bulk_kernel): the warp is both producer and consumer of its slots, so
// only the full barriers exist (count 1: lane 0's arrive.expect_tx) and a slot is free again as soon as the
// warp has read it: every lane fences (generic reads before the next async-proxy write), a __syncwarp, and
// the warp re-arms the slot for the stage S ahead. No cross-warp waits, so warps of a block never stall on
// each other's copies. Stage i lives in slot i % stages, round i / stages; consumers wait parity round & 1.
struct WarpRing {
  uint64_t* full;  // [stages], this warp's
  int stages;

  // Lane 0 only, then mbar_init_fence() and __syncthreads() by the block.
  __device__ void init() const {
    for (int s = 0; s < stages; ++s) mbar_init(&full[s], 1);
  }
  __device__ int slot(int i) const { return i % stages; }
  __device__ uint64_t* bar(int i) const { return &full[slot(i)]; }
  // Lane 0: arms stage i's slot for `bytes` of copies (the warp __syncwarp()s, then issues them on bar(i)).
  __device__ void arm(int i, uint32_t bytes) const { mbar_arrive_expect_tx(bar(i), bytes); }
  // All lanes: waits until stage i's bytes have landed.
  __device__ void wait_full(int i) const { mbar_wait(bar(i), static_cast<uint32_t>((i / stages) & 1)); }
  // All lanes: done reading stage i's slot; after this the warp may arm and refill it.
  __device__ void release() const {
    fence_proxy_async_smem();
    __syncwarp();
  }
};

}  // namespace tern::cuda::dev
