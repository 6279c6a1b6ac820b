// The execution context of an op (issue #17 item 5): the backend that runs it, for the device its tensors
// live on, and the memory a caller's intermediates come from. Passed to every op explicitly
// (`ops::linear(ctx, x, w, y)`), in place of the process-wide registry (backend.h: register_backend /
// backend_for) that picked a backend by the tensors' device.
//
// During the move the ops keep their registry-based overloads (`ops::linear(x, w, y)`), which run in
// Context::registry(): the backend registered for the tensors' device, looked up per call. The model passes
// its own context (Model::set_context; app/device.cpp builds it from the backend it makes), so a forward
// consults no registry for its ops; tests and tools still use the overloads.
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
  // The registry's context: each op runs on the backend registered for its tensors' device.
  static Context registry() { return Context(); }

  bool is_registry() const { return backend_ == nullptr; }
  // The device of an explicit context (Device::cpu for the registry's, whose ops run wherever their tensors
  // are).
  Device device() const { return device_; }
  // The backend for an op whose tensors are on `d`: this context's (d must be its device), or the registry's.
  Backend& backend_for(Device d) const;
  // A tensor on `device` (this context's, for an explicit one): from this context's memory when it has one.
  Tensor tensor(DType dtype, Shape shape, Device device, TensorInit init = TensorInit::zeros) const;

 private:
  Context() = default;
  Backend* backend_ = nullptr;
  Device device_ = Device::cpu;
  DeviceMemory* memory_ = nullptr;
};

}  // namespace tern::ops
