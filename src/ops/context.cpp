#include "ops/context.h"

#include "ops/backend.h"

namespace tern::ops {

namespace {
std::string_view device_name(Device d) {
  return d == Device::cpu ? "cpu" : "cuda";
}
}  // namespace

Context::Context(Backend& backend, Device device, DeviceMemory* memory, StepGraphs* step_graphs)
    : backend_(&backend), device_(device), memory_(memory), step_graphs_(step_graphs) {
  TERN_CHECK(step_graphs == nullptr || (device != Device::cpu && memory != nullptr),
             "a context with recorded steps needs a device and the memory its steps' tensors come from");
}

Backend& Context::backend_for(Device d) const {
  TERN_CHECK(d == device_, "an op's tensors are on ", device_name(d), " but its context runs ",
             backend_->name(), " on ", device_name(device_));
  return *backend_;
}

Tensor Context::tensor(DType dtype, Shape shape, Device device, TensorInit init) const {
  TERN_CHECK(device == device_, "a tensor on ", device_name(device),
             " from a context of ", device_name(device_));
  if (device == Device::cpu || memory_ == nullptr) return Tensor(dtype, shape, device, init);
  return Tensor(dtype, shape, device, *memory_, init);
}

}  // namespace tern::ops
