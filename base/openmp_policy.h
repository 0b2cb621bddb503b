// How the OpenMP team waits between parallel regions, chosen where a process
// starts (kilnd, kiln_bench, the test binaries).
//
// The CPU kernels and oneDNN share libgomp's team. A thread that finds no work
// spins GOMP_SPINCOUNT times before it sleeps on a futex: 300,000 by default
// (~3 ms), practically forever under OMP_WAIT_POLICY=ACTIVE, not at all under
// PASSIVE. On a host whose cores are shared (this project's 2-core machines
// under builds) a long spin is the worst choice: the spinning thread holds a
// core that the thread it waits for needs; a oneDNN matmul called from one
// thread took 24 ms p50 instead of 0.9 ms (docs/benchmarks.md, enc12). A short spin keeps the team warm across the back-to-back kernels of
// one run and puts it to sleep right after the run ends.
//
// These are libgomp's variables (g++ builds, what kilnd ships as). LLVM's libomp
// (clang's -fopenmp: the sanitizer builds) ignores GOMP_SPINCOUNT and keeps its
// own KMP_BLOCKTIME; the process still re-executes once with the variable set.
//
// libgomp reads its environment once, when it is loaded, before main() runs;
// so the policy is set by re-executing the process with the variable added
// (same pid, same arguments) when the environment names none.
#pragma once

namespace kiln {

// GOMP_SPINCOUNT used when the environment names no policy: libgomp's manual
// reckons ~100,000 spins a millisecond, so ~10 us, long enough for the next
// kernel of a run to find the team awake (docs/cpu.md, "OpenMP wait policy").
inline constexpr char kDefaultOpenMpSpinCount[] = "1000";

// Unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set (the operator's choice wins),
// sets GOMP_SPINCOUNT=kDefaultOpenMpSpinCount and re-executes this program
// (/proc/self/exe) with `argv`. Returns without re-executing when a variable
// is already set, and when the exec fails (the process then runs with
// libgomp's defaults). Call first thing in main(), before threads exist.
// REQUIRES: argv is main()'s argv (null-terminated).
void UseBoundedOpenMpSpin(char** argv);

}  // namespace kiln
