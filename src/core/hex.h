// Bytes as lowercase hex digits and back: the transfer descriptors carry CUDA IPC handles and NCCL unique ids so
// (src/transfer).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tern {

std::string to_hex(const void* bytes, size_t n);
// Exactly 2 n lowercase hex digits into `out`; false (out unspecified) on anything else.
bool from_hex(std::string_view digits, void* out, size_t n);

}  // namespace tern
