#include "model/safetensors_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tern::model {

void SafetensorsWriter::add(std::string name, DType dtype, Shape shape, Fill fill) {
  TERN_CHECK(name != "__metadata__", "a tensor cannot be named __metadata__");
  TERN_CHECK(names_.insert(name).second, "tensor \"", name, "\" added twice");
  tensors_.push_back(Pending{std::move(name), dtype, shape, std::move(fill)});
}

void SafetensorsWriter::add_bytes(std::string name, DType dtype, Shape shape, std::vector<std::byte> bytes) {
  TERN_CHECK(bytes.size() == dtype_bytes(dtype, shape.numel()), "tensor \"", name, "\": ", bytes.size(),
             " bytes given for ", shape.str(), " ", dtype_name(dtype));
  add(std::move(name), dtype, shape, [b = std::move(bytes)](std::byte* dst) {
    if (!b.empty()) std::memcpy(dst, b.data(), b.size());
  });
}

uint64_t SafetensorsWriter::data_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += dtype_bytes(t.dtype, t.shape.numel());
  return n;
}

std::vector<std::string> SafetensorsWriter::names() const {
  std::vector<std::string> out;
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

void SafetensorsWriter::write(const std::string& path) const {
  std::vector<const Pending*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const Pending* a, const Pending* b) {
    const int wa = dtype_bits(a->dtype), wb = dtype_bits(b->dtype);
    return wa != wb ? wa > wb : a->name < b->name;
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  uint64_t offset = 0;
  for (const Pending* t : order) {
    const uint64_t n = dtype_bytes(t->dtype, t->shape.numel());
    header[t->name] = {{"dtype", std::string(dtype_to_safetensors(t->dtype))},
                       {"shape", t->shape.to_vector()},
                       {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  TERN_CHECK(f, tmp, ": cannot create: ", std::strerror(errno));
  auto put = [&](const void* p, size_t n) {
    if (n && std::fwrite(p, 1, n, f) != n) {
      const int err = errno;
      std::fclose(f);
      std::remove(tmp.c_str());
      fail(tmp, ": write failed: ", std::strerror(err));
    }
  };
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
  put(len, 8);
  put(text.data(), text.size());
  std::vector<std::byte> buf;
  for (const Pending* t : order) {
    const size_t n = dtype_bytes(t->dtype, t->shape.numel());
    buf.assign(n, std::byte{0});
    if (t->fill) t->fill(buf.data());
    put(buf.data(), n);
  }
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    fail(tmp, ": write failed: ", std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  TERN_CHECK(!ec, path, ": cannot rename from ", tmp, ": ", ec.message());
}

}  // namespace tern::model
