// UseBoundedOpenMpSpin (base/openmp_policy.h), through the probe binary: the
// process re-executes itself (same pid, same arguments) with GOMP_SPINCOUNT
// set, libgomp starts with it, and an operator's own policy is left alone.
#include "base/openmp_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace kiln {
namespace {

struct ProbeResult {
  pid_t child = -1;
  std::string out;  // stdout then stderr
};

// Runs the probe with `env` as its whole environment and `args`.
ProbeResult RunProbe(const std::vector<std::string>& env, const std::vector<std::string>& args) {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  ProbeResult r;
  r.child = ::fork();
  if (r.child == 0) {
    ::dup2(fds[1], 1);
    ::dup2(fds[1], 2);
    ::close(fds[0]);
    std::vector<char*> argv = {const_cast<char*>(KILN_OPENMP_POLICY_PROBE)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    ::execve(KILN_OPENMP_POLICY_PROBE, argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) r.out.append(buf, n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(r.child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << r.out;
  return r;
}

using ::testing::HasSubstr;
using ::testing::Not;

// GOMP_SPINCOUNT is libgomp's (g++ builds: kilnd, make test). LLVM's libomp
// (clang builds: make test-asan / test-tsan) ignores it and prints KMP_*
// settings instead, so what libgomp read is checked only where it runs.
bool OnLibgomp(const ProbeResult& r) {
  EXPECT_THAT(r.out, ::testing::AnyOf(HasSubstr("runtime=libgomp\n"), HasSubstr("runtime=libomp\n")));
  return r.out.find("runtime=libgomp\n") != std::string::npos;
}

TEST(OpenMpPolicy, UnsetEnvironmentGetsTheBoundedSpinInTheSameProcess) {
  const ProbeResult r = RunProbe({"OMP_DISPLAY_ENV=verbose"}, {"first arg", "--second"});
  EXPECT_THAT(r.out, HasSubstr("pid=" + std::to_string(r.child) + "\n"));  // exec, not a child
  EXPECT_THAT(r.out, HasSubstr(std::string("GOMP_SPINCOUNT=") + kDefaultOpenMpSpinCount + "\n"));
  EXPECT_THAT(r.out, HasSubstr("OMP_WAIT_POLICY=-\n"));
  EXPECT_THAT(r.out, HasSubstr("arg=first arg\narg=--second\n"));
  EXPECT_THAT(r.out, HasSubstr("threads_ok=1"));
  // libgomp itself started with the bound (OMP_DISPLAY_ENV=verbose prints what
  // it read: its default in the first image, the bound in the second).
  if (!OnLibgomp(r)) return;
  EXPECT_THAT(r.out, HasSubstr("GOMP_SPINCOUNT = '300000'"));
  EXPECT_THAT(r.out, HasSubstr(std::string("GOMP_SPINCOUNT = '") + kDefaultOpenMpSpinCount + "'"));
}

TEST(OpenMpPolicy, AnOperatorsWaitPolicyIsLeftAlone) {
  const ProbeResult r = RunProbe({"OMP_WAIT_POLICY=PASSIVE"}, {});
  EXPECT_THAT(r.out, HasSubstr("GOMP_SPINCOUNT=-\n"));
  EXPECT_THAT(r.out, HasSubstr("OMP_WAIT_POLICY=PASSIVE\n"));
}

TEST(OpenMpPolicy, AnOperatorsSpinCountIsLeftAlone) {
  const ProbeResult r = RunProbe({"GOMP_SPINCOUNT=123", "OMP_DISPLAY_ENV=verbose"}, {});
  EXPECT_THAT(r.out, HasSubstr("GOMP_SPINCOUNT=123\n"));
  if (!OnLibgomp(r)) return;
  EXPECT_THAT(r.out, HasSubstr("GOMP_SPINCOUNT = '123'"));
  EXPECT_THAT(r.out, Not(HasSubstr(std::string("'") + kDefaultOpenMpSpinCount + "'")));
}

}  // namespace
}  // namespace kiln
