// Where the blocks of a recorded step's activation arena go (backends/cuda/cuda_graph_arena.cpp): offsets in one
// region, reused within the step once their tensor is freed, so the arena is sized by the step's peak of live
// tensors, not by all it ever allocated (a bump allocator's 1.7 GiB at 64 decode slots; the verify graphs' 4x).
//
// Blocks freed while a concurrent side branch is pending (ops/branch.h: between its begin and its join) become free
// only at the join: until then a kernel of the other lane may still read or write them. A block freed before the
// branch began may be reused inside it (its users were issued before the fork).
//
// Deterministic: the same sequence of calls gives the same offsets, so a measuring dry run and the capture that
// follows it agree on the peak. Plain host code (no device), unit-tested on the CPU.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

namespace tern {

class ArenaPlan {
 public:
  static constexpr size_t kAlign = 256;

  // A new step: nothing handed out, no branch pending, peak 0.
  void reset();
  // The offset of a block of `bytes` (rounded up to kAlign): the lowest free block that holds it, else at the end.
  // fresh(): whether that block lies wholly beyond every block handed out before in this step.
  size_t allocate(size_t bytes);
  bool last_fresh() const { return last_fresh_; }
  // The block at `offset` (handed out by allocate, not yet released) is free; deferred while a branch is pending.
  void release(size_t offset);
  void branch_begin();
  void branch_join();
  // The end of the highest block ever handed out since reset(): the bytes the step needs.
  size_t peak() const { return peak_; }
  size_t live_blocks() const { return live_.size(); }

 private:
  void free_block(size_t offset, size_t bytes);

  std::map<size_t, size_t> free_;  // offset -> bytes, coalesced, all below top_
  std::map<size_t, size_t> live_;  // offset -> bytes
  std::vector<size_t> deferred_;   // offsets released while a branch is pending
  size_t top_ = 0, peak_ = 0;
  bool pending_ = false, last_fresh_ = false;
};

}  // namespace tern
