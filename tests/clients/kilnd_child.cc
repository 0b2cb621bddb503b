#include "tests/clients/kilnd_child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace kiln::testing {
namespace {

int WaitStatus(int raw) { return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1; }

// The test environment itself is broken (no /tmp, no fork): stop here.
[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "kilnd_child: %s: %s\n", what.c_str(), std::strerror(errno));
  std::abort();
}

}  // namespace

std::string ReadFileOrDie(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) Die("cannot open " + path);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

ScratchDir::ScratchDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = absl::StrCat(tmp ? tmp : "/tmp", "/kiln_client_test.XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) Die("mkdtemp " + pattern);
  path_ = pattern;
}

ScratchDir::~ScratchDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

absl::StatusOr<std::unique_ptr<KilndChild>> KilndChild::Start(
    const std::string& cache_dir, const std::string& binary,
    const std::vector<std::string>& extra_flags) {
  std::unique_ptr<KilndChild> k(new KilndChild);
  k->dir_ = std::make_unique<ScratchDir>();
  const std::string port_file = k->dir_->path() + "/port";
  const std::string log = k->dir_->path() + "/log";
  std::vector<std::string> args = {binary.empty() ? std::string(KILND_PATH) : binary,
                                   "--listen=127.0.0.1:0",
                                   "--port_file=" + port_file,
                                   "--metrics_listen=127.0.0.1:0",
                                   "--cache_dir=" + cache_dir,
                                   "--log_level=warn"};
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  k->pid_ = pid;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (absl::Now() < deadline) {
    int raw = 0;
    if (waitpid(pid, &raw, WNOHANG) == pid) {
      k->pid_ = -1;
      return absl::InternalError(
          absl::StrCat("kilnd exited with ", WaitStatus(raw), " at start:\n", k->Log()));
    }
    std::ifstream f(port_file);
    std::string line;
    int port = 0;
    if (f && std::getline(f, line) && absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &port) &&
        port > 0) {
      k->addr_ = absl::StrCat("127.0.0.1:", port);
      return k;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("kilnd wrote no port file in 60 s:\n", k->Log()));
}

int KilndChild::Stop() {
  if (pid_ < 0) return -1;
  kill(pid_, SIGTERM);
  int raw = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (waitpid(pid_, &raw, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &raw, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  pid_ = -1;
  return WaitStatus(raw);
}

KilndChild::~KilndChild() { Stop(); }

std::string KilndChild::Log() const {
  std::ifstream f(dir_->path() + "/log");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const KilndChild& SharedKilnd() {
  struct Shared {
    ScratchDir cache;
    std::unique_ptr<KilndChild> kilnd;
  };
  static Shared* shared = [] {
    auto* s = new Shared;
    auto k = KilndChild::Start(s->cache.path());
    if (!k.ok()) {
      std::fprintf(stderr, "cannot start kilnd: %s\n", std::string(k.status().message()).c_str());
      std::abort();
    }
    s->kilnd = std::move(*k);
    // Stop kilnd (and remove its cache) when the test binary exits.
    std::atexit([] { delete shared; });
    return s;
  }();
  return *shared->kilnd;
}

ProcessResult RunProcess(const std::vector<std::string>& argv_in,
                         const std::vector<std::string>& extra_env) {
  ScratchDir dir;
  const std::string out = dir.path() + "/out", err = dir.path() + "/err";
  const pid_t pid = fork();
  if (pid < 0) Die("fork");
  if (pid == 0) {
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    for (const std::string& kv : extra_env) putenv(strdup(kv.c_str()));
    std::vector<std::string> args = argv_in;
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int raw = 0;
  waitpid(pid, &raw, 0);
  ProcessResult r;
  r.status = WaitStatus(raw);
  r.out = ReadFileOrDie(out);
  r.err = ReadFileOrDie(err);
  return r;
}

}  // namespace kiln::testing
