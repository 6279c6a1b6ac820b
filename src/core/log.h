// Logging front end. spdlog lives only in log.cpp: it does not compile inside nvcc C++20 units.
#pragma once

#include <string>

#include "core/error.h"

namespace tern::log {

enum class Level { debug, info, warn, error };

void set_level(Level level);
void write(Level level, const std::string& message);

template <typename... Args>
void debug(Args&&... args) { write(Level::debug, cat(std::forward<Args>(args)...)); }
template <typename... Args>
void info(Args&&... args) { write(Level::info, cat(std::forward<Args>(args)...)); }
template <typename... Args>
void warn(Args&&... args) { write(Level::warn, cat(std::forward<Args>(args)...)); }
template <typename... Args>
void error(Args&&... args) { write(Level::error, cat(std::forward<Args>(args)...)); }

}  // namespace tern::log
