// Probe for openmp_policy_test: applies UseBoundedOpenMpSpin, starts the
// OpenMP team, then prints its pid, the policy variables, which OpenMP runtime
// it runs on and its arguments, one per line ("-" for unset).
#include <dlfcn.h>
#include <omp.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "base/openmp_policy.h"

int main(int argc, char** argv) {
  kiln::UseBoundedOpenMpSpin(argv);
  int threads = 0;
#pragma omp parallel
  {
#pragma omp atomic
    ++threads;
  }
  const char* spin = std::getenv("GOMP_SPINCOUNT");
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  std::printf("pid=%d\nGOMP_SPINCOUNT=%s\nOMP_WAIT_POLICY=%s\nthreads_ok=%d\n", ::getpid(),
              spin ? spin : "-", policy ? policy : "-", threads >= 1);
  // LLVM's libomp (clang's -fopenmp: the sanitizer builds) exports its own
  // entry points beside GOMP_* compatibility ones; libgomp has no __kmpc_*.
  std::printf("runtime=%s\n", ::dlsym(RTLD_DEFAULT, "__kmpc_fork_call") ? "libomp" : "libgomp");
  for (int i = 1; i < argc; ++i) std::printf("arg=%s\n", argv[i]);
  return 0;
}
