// Reading tokenizer.json fields with errors that name the JSON path of the bad field
// (for example `model.merges[12]`). Internal to the tokenizer library.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <string_view>

#include "core/error.h"

namespace tern::tokenizer::json_fields {

using nlohmann::json;

inline std::string type_name(const json& j) { return j.type_name(); }

inline std::string child(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : path + "." + std::string(key);
}
inline std::string child(const std::string& path, std::size_t index) {
  return path + "[" + std::to_string(index) + "]";
}

[[noreturn]] inline void bad(const std::string& path, std::string_view what) {
  fail("tokenizer.json field `", path, "`: ", what);
}

inline const json& require(const json& obj, std::string_view key, const std::string& path) {
  if (!obj.is_object()) bad(path, "expected an object, found " + type_name(obj));
  const auto it = obj.find(key);
  if (it == obj.end()) bad(child(path, key), "missing");
  return *it;
}

inline const json* optional(const json& obj, std::string_view key) {
  if (!obj.is_object()) return nullptr;
  const auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

inline std::string get_string(const json& j, const std::string& path) {
  if (!j.is_string()) bad(path, "expected a string, found " + type_name(j));
  return j.get<std::string>();
}

inline bool get_bool(const json& obj, std::string_view key, const std::string& path, bool fallback) {
  const json* j = optional(obj, key);
  if (j == nullptr) return fallback;
  if (!j->is_boolean()) bad(child(path, key), "expected true or false, found " + type_name(*j));
  return j->get<bool>();
}

inline std::int64_t get_int(const json& j, const std::string& path) {
  if (!j.is_number_integer()) bad(path, "expected an integer, found " + type_name(j));
  return j.get<std::int64_t>();
}

inline std::string type_of(const json& obj, const std::string& path) {
  return get_string(require(obj, "type", path), child(path, "type"));
}

}  // namespace tern::tokenizer::json_fields
