#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace tern::log {
namespace {

spdlog::logger& logger() {
  static auto instance = [] {
    auto l = spdlog::stderr_color_mt("tern");
    l->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ %v");
    return l;
  }();
  return *instance;
}

spdlog::level::level_enum to_spdlog(Level level) {
  switch (level) {
    case Level::debug: return spdlog::level::debug;
    case Level::info: return spdlog::level::info;
    case Level::warn: return spdlog::level::warn;
    case Level::error: return spdlog::level::err;
  }
  return spdlog::level::info;
}

}  // namespace

void set_level(Level level) { logger().set_level(to_spdlog(level)); }
void write(Level level, const std::string& message) { logger().log(to_spdlog(level), message); }

}  // namespace tern::log
