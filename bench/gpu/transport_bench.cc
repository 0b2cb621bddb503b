// The device-worker transport alone (issue 8, res8): one upload of N MiB and one
// read-back through a device worker process, then the stream's synchronize, timed on
// the wall clock (median of --iters after 2 warm-ups), with the host buffers
//   staging: ordinary heap memory (pre-faulted, reused every time): kilnd copies x
//            into the worker's shared staging region and y out of it (main's path);
//   arena:   blocks of a host arena the worker maps (base/host_arena.h; a CUDA
//            worker registers it): x and y cross by reference, no host copy in kilnd.
// On --backend cpu (any machine) the worker's own copies are memcpys too, so the
// figure is the host copies kilnd no longer makes; on --backend cuda the worker DMAs.
//   transport_bench [--backend cpu|cuda] [--mib 3,25,64] [--iters 20]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "base/host_arena.h"
#include "engine/runtime/worker_client.h"
#include "nlohmann/json.hpp"

namespace {

using kiln::HostArena;
namespace worker = kiln::runtime::worker;

double MedianMs(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> flags;
  for (int i = 1; i + 1 < argc; i += 2) flags[argv[i]] = argv[i + 1];
  auto flag = [&](const char* name, const std::string& def) {
    return flags.contains(name) ? flags.at(name) : def;
  };
  const std::string backend = flag("--backend", "cpu");
  int iters = 0;
  if (!absl::SimpleAtoi(flag("--iters", "20"), &iters) || iters <= 0) return 2;
  std::vector<int64_t> sizes;
  for (absl::string_view m : absl::StrSplit(flag("--mib", "3,25,64"), ',')) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(m, &v) || v <= 0) return 2;
    sizes.push_back(v << 20);
  }
  const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
  auto arena = HostArena::Create(2 * largest + (int64_t{1} << 20));
  if (!arena.ok()) {
    std::fprintf(stderr, "arena: %s\n", std::string(arena.status().message()).c_str());
    return 1;
  }
  worker::WorkerOptions o;
  o.binary = worker::DefaultWorkerBinary();
  o.backend = backend;
  o.backend_options.cpu_threads = 1;
  o.host_arena = arena->get();
  auto iso = worker::StartIsolatedBackend(o);
  if (!iso.ok() || iso->devices.empty()) {
    std::fprintf(stderr, "worker: %s\n",
                 iso.ok() ? "no device" : std::string(iso.status().message()).c_str());
    return 1;
  }
  kiln::backend::Device& dev = *iso->devices[0];
  auto stream = dev.CreateStream();
  if (!stream.ok()) return 1;
  for (const int64_t n : sizes) {
    auto buf = dev.Allocate(n);
    if (!buf.ok()) return 1;
    std::vector<char> hx(static_cast<size_t>(n), 1), hy(static_cast<size_t>(n), 0);
    char* ax = static_cast<char*>((*arena)->Allocate(n));
    char* ay = static_cast<char*>((*arena)->Allocate(n));
    if (ax == nullptr || ay == nullptr) return 1;
    std::memset(ax, 1, static_cast<size_t>(n));
    std::memset(ay, 0, static_cast<size_t>(n));
    std::map<std::string, double> ms;
    for (const auto& [mode, x, y] : {std::tuple{"staging", hx.data(), hy.data()},
                                     std::tuple{"arena", ax, ay}}) {
      std::vector<double> t;
      for (int i = 0; i < 2 + iters; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        absl::Status s = dev.CopyToDevice(**stream, x, {buf->get(), 0, n});
        if (s.ok()) s = dev.CopyToHost(**stream, {buf->get(), 0, n}, y);
        if (s.ok()) s = (*stream)->SynchronizeFor(absl::Seconds(60));
        const auto t1 = std::chrono::steady_clock::now();
        if (!s.ok()) {
          std::fprintf(stderr, "%s: %s\n", mode, std::string(s.message()).c_str());
          return 1;
        }
        if (i >= 2) t.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      if (std::memcmp(x, y, static_cast<size_t>(n)) != 0) {
        std::fprintf(stderr, "%s: the bytes read back differ\n", mode);
        return 1;
      }
      ms[mode] = MedianMs(t);
    }
    (*arena)->Release(ax);
    (*arena)->Release(ay);
    const double gb = 2.0 * static_cast<double>(n) / 1e9;  // up and down
    const nlohmann::json out = {{"bench", "worker_transport"},
                                {"backend", backend},
                                {"mib", n >> 20},
                                {"iters", iters},
                                {"staging_ms", ms["staging"]},
                                {"arena_ms", ms["arena"]},
                                {"staging_gbps", gb / (ms["staging"] / 1e3)},
                                {"arena_gbps", gb / (ms["arena"] / 1e3)},
                                {"staging_over_arena", ms["staging"] / ms["arena"]}};
    std::printf("%s\n", out.dump().c_str());
  }
  stream->reset();
  iso->devices.clear();  // the worker goes before the arena it maps
  return 0;
}
