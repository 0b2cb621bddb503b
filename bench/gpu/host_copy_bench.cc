// The host copies around a device run (issue 8, io8; docs/cuda.md "Where an
// isolated run's time goes"): a tensor of --mib MiB copied by one memcpy (the
// earlier path) and by HostCopier (base/host_copy.h) with its default threads,
// alternating, into a destination reused every time (kilnd's staging region, a
// caller's output destination) and into a fresh allocation each time (a fresh
// HostTensor output before io8: new pages, faulted in by the copy) and into a
// buffer from HostBufferPool each time (a HostTensor output now: the pool hands
// back the last one's pages). Prints one JSON line
// per case with the median GB/s over --iters copies and the speed-up.
//   host_copy_bench [--mib 25] [--iters 30]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "base/host_buffer_pool.h"
#include "base/host_copy.h"
#include "nlohmann/json.hpp"
#include "bench/gpu/bench_util.h"

namespace {

using kiln::bench::Median;

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  const int64_t mib = flags.contains("--mib") ? std::stoll(flags["--mib"]) : 25;
  const int iters = flags.contains("--iters") ? std::stoi(flags["--iters"]) : 30;
  if (mib <= 0 || iters <= 0) return 2;
  const int64_t bytes = mib << 20;
  std::vector<char> src(static_cast<size_t>(bytes)), reused(static_cast<size_t>(bytes));
  for (int64_t i = 0; i < bytes; ++i) src[static_cast<size_t>(i)] = static_cast<char>(i * 131);
  std::memcpy(reused.data(), src.data(), src.size());  // its pages exist
  kiln::HostCopier& copier = kiln::HostCopier::Default();
  kiln::HostBufferPool& pool = kiln::HostBufferPool::Default();
  for (const std::string destination : {"reused", "fresh", "pool"}) {
    const bool fresh = destination == "fresh", pooled = destination == "pool";
    std::vector<double> one, split;
    for (int i = 0; i < iters; ++i) {
      for (const bool use_copier : {false, true}) {
        char* dst = reused.data();
        if (fresh) dst = static_cast<char*>(std::aligned_alloc(64, static_cast<size_t>(bytes)));
        if (pooled) dst = static_cast<char*>(pool.Allocate(static_cast<size_t>(bytes)));
        if (dst == nullptr) return 1;
        const auto t0 = std::chrono::steady_clock::now();
        if (use_copier)
          copier.Copy(dst, src.data(), bytes);
        else
          std::memcpy(dst, src.data(), static_cast<size_t>(bytes));
        const auto t1 = std::chrono::steady_clock::now();
        if (dst[bytes - 1] != src[static_cast<size_t>(bytes - 1)]) return 1;
        if (fresh) std::free(dst);
        if (pooled) pool.Release(dst);
        const double s = std::chrono::duration<double>(t1 - t0).count();
        (use_copier ? split : one).push_back(static_cast<double>(bytes) / s / 1e9);
      }
    }
    const double a = Median(one), b = Median(split);
    const nlohmann::json out = {{"bench", "host_copy"},
                                {"mib", mib},
                                {"destination", destination},
                                {"threads", copier.threads()},
                                {"memcpy_gbps", a},
                                {"host_copier_gbps", b},
                                {"memcpy_ms", static_cast<double>(bytes) / a / 1e6},
                                {"host_copier_ms", static_cast<double>(bytes) / b / 1e6},
                                {"speedup", b / a}};
    std::printf("%s\n", out.dump().c_str());
  }
  return 0;
}
