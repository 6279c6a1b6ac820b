// The execution context of an op (issue #17 item 5): the backend that runs it, for the device its tensors
// live on, the memory a caller's intermediates come from, and the backend's recorded steps (CUDA graphs) where
// it has them. Passed to every op explicitly (`ops::linear(ctx, x, w, y)`); there is no process-wide backend
// registry, and no device-keyed lookup of the step graphs. Each backend gives the context of its instance
// (cpu::context(), cuda::context()); app/device.cpp gives a model the one of its device (app::device_context),
// and tests build their own around a stand-in backend.
#pragma once

#include <functional>

#include "core/tensor.h"

namespace tern::ops {

class Backend;
class StepGraphs;

class Context {
 public:
  // `backend` runs every op of this context, whose tensors must be on `device`; device tensors made through
  // tensor() come from `memory` (nullptr: the memory registered for the device, core/tensor.h). `step_graphs`:
  // the backend's recorded steps (ops/recorded_steps.h), or nullptr when it records none; with them, `memory`
  // must be the one whose tensors come from their arena while a scope is open (the CUDA backend's step memory),
  // so that a recorded step's intermediates made through tensor() are arena blocks.
  Context(Backend& backend, Device device, DeviceMemory* memory = nullptr, StepGraphs* step_graphs = nullptr);

  Device device() const { return device_; }
  // The memory tensor() takes device tensors from (nullptr: the device's registered one).
  DeviceMemory* memory() const { return memory_; }
  // The recorded steps of this context's backend (engine/decode_graphs.h drives them); nullptr when none.
  StepGraphs* step_graphs() const { return step_graphs_; }
  // The backend for an op whose tensors are on `d`, which must be this context's device.
  Backend& backend_for(Device d) const;
  // A tensor on `device` (this context's): from this context's memory when it has one.
  Tensor tensor(DType dtype, Shape shape, Device device, TensorInit init = TensorInit::zeros) const;

 private:
  Backend* backend_;
  Device device_;
  DeviceMemory* memory_;
  StepGraphs* step_graphs_;
};

}  // namespace tern::ops
