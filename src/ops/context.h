// The execution context of an op (issue #17 item 5): the backend that runs it, for the device its tensors
// live on, and the memory a caller's intermediates come from. Passed to every op explicitly
// (`ops::linear(ctx, x, w, y)`); there is no process-wide backend registry. Each backend gives the context of
// its instance (cpu::context(), cuda::context()); app/device.cpp gives a model the one of its device
// (app::device_context), and tests build their own around a stand-in backend.
#pragma once

#include <functional>

#include "core/tensor.h"

namespace tern::ops {

class Backend;

class Context {
 public:
  // `backend` runs every op of this context, whose tensors must be on `device`; device tensors made through
  // tensor() come from `memory` (nullptr: the memory registered for the device, core/tensor.h).
  Context(Backend& backend, Device device, DeviceMemory* memory = nullptr)
      : backend_(&backend), device_(device), memory_(memory) {}

  Device device() const { return device_; }
  // The backend for an op whose tensors are on `d`, which must be this context's device.
  Backend& backend_for(Device d) const;
  // A tensor on `device` (this context's): from this context's memory when it has one.
  Tensor tensor(DType dtype, Shape shape, Device device, TensorInit init = TensorInit::zeros) const;

 private:
  Backend* backend_;
  Device device_;
  DeviceMemory* memory_;
};

}  // namespace tern::ops
