// A real kilnd child process for the client tests: the built binary
// (KILND_PATH) on 127.0.0.1 with an ephemeral gRPC port, an ephemeral metrics
// port and a cache directory the test chooses (so a restart can find it).
#pragma once

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kiln::testing {

// A fresh directory under $TMPDIR, removed recursively on destruction.
class ScratchDir {
 public:
  ScratchDir();
  ~ScratchDir();
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

class KilndChild {
 public:
  // Starts kilnd (`binary`, default KILND_PATH) with --cache_dir=`cache_dir`
  // and `extra_flags`, and waits (up to 60 s) for its port file. On failure
  // the error carries kilnd's log.
  static absl::StatusOr<std::unique_ptr<KilndChild>> Start(
      const std::string& cache_dir, const std::string& binary = "",
      const std::vector<std::string>& extra_flags = {});
  // SIGTERM, then waits for the exit (SIGKILL after 30 s).
  ~KilndChild();
  KilndChild(const KilndChild&) = delete;
  KilndChild& operator=(const KilndChild&) = delete;

  // "127.0.0.1:<port>"
  const std::string& addr() const { return addr_; }
  // The kilnd process (benchmarks read its CPU time from /proc).
  pid_t pid() const { return pid_; }
  // SIGTERM and wait; the exit status (-1 when killed by a signal).
  int Stop();
  std::string Log() const;

 private:
  KilndChild() = default;
  std::unique_ptr<ScratchDir> dir_;
  pid_t pid_ = -1;
  std::string addr_;
};

// One kilnd shared by the tests of a binary, started on first use with its
// own cache directory and stopped at exit. Aborts the test binary when kilnd
// does not start (printing its log): nothing else could pass.
const KilndChild& SharedKilnd();

// Runs `argv` (argv[0] is a path) to completion with stdout and stderr
// captured; the exit status, or -1 when it died by a signal.
struct ProcessResult {
  int status = -1;
  std::string out;
  std::string err;
};
ProcessResult RunProcess(const std::vector<std::string>& argv,
                         const std::vector<std::string>& extra_env = {});

std::string ReadFileOrDie(const std::string& path);

}  // namespace kiln::testing
