// Recorded steps on a device (CUDA graphs): an activation arena, so that a recorded step allocates
// nothing and finds its intermediates at the same addresses every replay, and capture / replay of a
// step's device work. Owned by a device backend that supports it (the CUDA backend does) and reached through
// the context of that backend (ops::Context::step_graphs: there is no device-keyed registry); the runner's
// decode-graph driver (engine/decode_graphs.h) takes them from the model's context and knows no device API.
// The device-neutral interface; the CUDA implementation is backends/cuda/cuda_graph_arena.h (distinct names,
// so an include says which side it wants).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "core/tensor.h"

namespace tern::ops {

class StepGraphs {
 public:
  virtual ~StepGraphs() = default;

  // While an arena scope is open, the step's device tensors come from the arena, through an explicit path: the
  // memory of the context these graphs belong to (Context::memory, what Context::tensor takes the forward's
  // intermediates from) and the backend's own transient tensors (it allocates them from the same memory) take
  // arena blocks: planned from an empty arena at begin, a freed block reused within the scope (the CUDA arena:
  // core/arena_plan.h), filled as a device tensor of the pool would be, released with the arena. A device
  // tensor from anywhere else while a step is recorded (core's Tensor(dtype, shape, device) on the device's
  // registered memory) is refused: the capture fails, saying so (never a silent allocation the replays lose).
  // measure = true: allocations come from the ordinary pool and are only planned (the dry run that
  // sizes the arena). Outside measure mode, running past the arena's size throws.
  virtual void arena_begin(bool measure) = 0;
  // Closes the scope; returns the bytes the scope needs (its plan's peak).
  virtual size_t arena_end() = 0;
  // (Re)allocates the arena; every recorded step is dropped (their addresses are gone).
  virtual void arena_reserve(size_t bytes) = 0;
  virtual size_t arena_bytes() const = 0;

  // Records `body`'s device work (nothing runs); returns a handle. Throws, saying why, when the body or
  // the capture fails (the capture is then abandoned and nothing is recorded).
  virtual int capture(const std::function<void()>& body) = 0;
  // Runs recorded step `handle` (ordered after the device work issued so far, and before what follows).
  virtual void replay(int handle) = 0;
  virtual void drop_all() = 0;
  // Device memory the recorded steps took (the drop in free device memory across their instantiation).
  virtual size_t graph_bytes() const = 0;
  // Changes whenever an address a recorded step may hold moves (the arena, the backend's workspace):
  // steps recorded under another generation must be recorded again.
  virtual uint64_t generation() const = 0;
  // Page-locked host memory of at least `bytes` (the per-step tables' staging, so their copy is one DMA),
  // owned by the graphs; valid until a larger request or the graphs' end.
  virtual void* pinned_host(size_t bytes) = 0;
};

}  // namespace tern::ops
