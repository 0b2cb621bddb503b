// What the GPU benchmarks share: the median of timed rounds and a CUDA runtime
// call check that ends the benchmark with the failing call's name.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace kiln::bench {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace kiln::bench

#define CHECK_CUDA(x)                                                          \
  do {                                                                         \
    auto e = (x);                                                              \
    if (e != 0) {                                                              \
      std::fprintf(stderr, "%s failed: %d (line %d)\n", #x, int(e), __LINE__); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)
