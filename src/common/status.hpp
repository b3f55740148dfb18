// Internal error plumbing: every check returns a Status whose message names the argument.
#pragma once

#include <cstdio>
#include <string>
#include <utility>

#include "flashattn/flashattn.hpp"

namespace flashattn {

template <class... Args>
std::string format(const char* fmt, Args... args) {
  int n = std::snprintf(nullptr, 0, fmt, args...);
  std::string s(size_t(n > 0 ? n : 0), '\0');
  std::snprintf(s.data(), s.size() + 1, fmt, args...);
  return s;
}

template <class... Args>
Status invalid(const char* fmt, Args... args) {
  return {FA_ERROR_INVALID_ARGUMENT, format(fmt, args...)};
}

template <class... Args>
Status unsupported(const char* fmt, Args... args) {
  return {FA_ERROR_UNSUPPORTED, format(fmt, args...)};
}

#define FA_RETURN_IF_ERROR(expr)        \
  do {                                  \
    ::flashattn::Status s_ = (expr);    \
    if (!s_.ok()) return s_;            \
  } while (0)

}  // namespace flashattn
