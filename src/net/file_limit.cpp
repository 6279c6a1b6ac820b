// The file limit and the connections under it (http.h).
#include <sys/resource.h>

#include <algorithm>

#include "net/http.h"

namespace tern::net {

FileLimit raise_file_limit() {
  FileLimit f;
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return f;
  f.was = f.soft = r.rlim_cur;
  f.hard = r.rlim_max;
  if (r.rlim_cur < r.rlim_max) {
    rlimit raised = r;
    raised.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) f.soft = r.rlim_max;
  }
  return f;
}

size_t connections_within(const FileLimit& f, size_t wanted, size_t per_connection, size_t reserved) {
  if (f.soft == 0 || f.soft == RLIM_INFINITY) return wanted;
  const uint64_t room = f.soft > reserved * 2 ? f.soft - reserved : f.soft / 2;
  return std::max<size_t>(1, std::min<uint64_t>(wanted, room / std::max<size_t>(per_connection, 1)));
}

}  // namespace tern::net
