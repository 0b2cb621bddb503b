#include "tests/server/kilnd_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <thread>

#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

extern char** environ;

namespace kiln::testing {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

pid_t Spawn(const std::vector<std::string>& args, const std::string& log_path) {
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(KILND_PATH));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  if (posix_spawn(&pid, KILND_PATH, &actions, nullptr, argv.data(), environ) != 0) pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  return pid;
}

// Exit code, or nullopt (still running at the deadline, or killed by a signal).
std::optional<int> Reap(pid_t pid, absl::Duration timeout, bool* exited) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      *exited = true;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      return std::nullopt;
    }
    if (absl::Now() > deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int ReadPort(const std::string& path) {
  int port = 0;
  std::string text = ReadFile(path);
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text), &port)) return 0;
  return port;
}

}  // namespace

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string templ = absl::StrCat(base && *base ? base : "/tmp", "/kiln-server-test-XXXXXX");
  char* made = mkdtemp(templ.data());
  path_ = made ? made : "";
}

TempDir::~TempDir() {
  std::error_code ec;
  if (!path_.empty()) std::filesystem::remove_all(path_, ec);
}

std::unique_ptr<KilndProcess> KilndProcess::Start(const KilndOptions& options, std::string* error) {
  std::unique_ptr<KilndProcess> p(new KilndProcess());
  p->dir_ = std::make_unique<TempDir>();
  const std::string dir = p->dir_->path();
  std::vector<std::string> args = {"--listen=127.0.0.1:0",
                                   absl::StrCat("--port_file=", dir, "/port"),
                                   "--metrics_listen=127.0.0.1:0",
                                   absl::StrCat("--metrics_port_file=", dir, "/metrics_port"),
                                   absl::StrCat("--cache_dir=", options.cache_dir)};
  if (!options.config_text.empty()) {
    std::ofstream(dir + "/config.textproto") << options.config_text;
    args.push_back(absl::StrCat("--config=", dir, "/config.textproto"));
  }
  for (const std::string& f : options.extra_flags) args.push_back(f);
  p->pid_ = Spawn(args, dir + "/log");
  if (p->pid_ < 0) {
    *error = absl::StrCat("cannot spawn ", KILND_PATH);
    return nullptr;
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (p->port_ == 0 || p->metrics_port_ == 0) {
    p->port_ = ReadPort(dir + "/port");
    p->metrics_port_ = ReadPort(dir + "/metrics_port");
    if (p->port_ != 0 && p->metrics_port_ != 0) break;
    if (Reap(p->pid_, absl::ZeroDuration(), &p->exited_).has_value() || p->exited_ ||
        absl::Now() > deadline) {
      *error = absl::StrCat("kilnd did not start; its log:\n", p->Log());
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  grpc::ChannelArguments ch;
  ch.SetMaxReceiveMessageSize(256 << 20);
  ch.SetMaxSendMessageSize(256 << 20);
  p->channel_ = grpc::CreateCustomChannel(p->address(), grpc::InsecureChannelCredentials(), ch);
  return p;
}

KilndProcess::~KilndProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    Reap(pid_, absl::Seconds(10), &exited_);
  }
}

std::string KilndProcess::address() const { return absl::StrCat("127.0.0.1:", port_); }

std::unique_ptr<v1::Kiln::Stub> KilndProcess::Stub() const { return v1::Kiln::NewStub(channel_); }

void KilndProcess::Signal(int sig) const { kill(pid_, sig); }

std::optional<int> KilndProcess::WaitExit(absl::Duration timeout) {
  return Reap(pid_, timeout, &exited_);
}

std::string KilndProcess::Log() const { return ReadFile(dir_->path() + "/log"); }

int RunKilndToExit(const std::vector<std::string>& args, std::string* output,
                   absl::Duration timeout) {
  TempDir dir;
  const pid_t pid = Spawn(args, dir.path() + "/log");
  if (pid < 0) return -1;
  bool exited = false;
  std::optional<int> code = Reap(pid, timeout, &exited);
  if (!exited) {
    kill(pid, SIGKILL);
    Reap(pid, absl::Seconds(10), &exited);
  }
  *output = ReadFile(dir.path() + "/log");
  return code.value_or(-1);
}

std::unique_ptr<grpc::ClientContext> Context(const std::string& api_key, absl::Duration deadline) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!api_key.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", api_key));
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  return ctx;
}

v1::Tensor ToProto(const HostTensor& t) {
  v1::Tensor p;
  t.ToProto(&p);
  return p;
}

HostTensor FromProto(const v1::Tensor& t) {
  auto h = HostTensor::FromProto(t);
  return h.ok() ? std::move(h).value() : HostTensor();
}

std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string req =
        absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if (send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
      std::string all;
      char buf[8192];
      for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) all.append(buf, n);
      const size_t split = all.find("\r\n\r\n");
      if (split != std::string::npos) body = all.substr(split + 4);
    }
  }
  close(fd);
  return body;
}

double MetricValue(const std::string& exposition, const std::string& name,
                   const std::map<std::string, std::string>& labels) {
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    const absl::string_view metric = line.substr(0, std::min(brace, space));
    if (metric != name) continue;
    std::map<std::string, std::string> have;
    if (brace != absl::string_view::npos && brace < space) {
      const size_t close = line.find('}', brace);
      for (absl::string_view kv : absl::StrSplit(line.substr(brace + 1, close - brace - 1), ',')) {
        const size_t eq = kv.find('=');
        if (eq == absl::string_view::npos) continue;
        std::string v(kv.substr(eq + 1));
        if (v.size() >= 2) v = v.substr(1, v.size() - 2);
        have[std::string(kv.substr(0, eq))] = v;
      }
    }
    bool match = true;
    for (const auto& [k, v] : labels) match = match && have.contains(k) && have[k] == v;
    double value = 0;
    if (match && absl::SimpleAtod(line.substr(space + 1), &value)) sum += value;
  }
  return sum;
}

grpc::Status RawUnaryCall(grpc::Channel& channel, const std::string& method,
                          const std::string& request_bytes, std::string* response_bytes,
                          const std::string& api_key) {
  grpc::GenericStub stub(channel.shared_from_this());
  auto ctx = Context(api_key, absl::Seconds(30));
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(ctx.get(), method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  if (status.ok() && response_bytes != nullptr) {
    std::vector<grpc::Slice> slices;
    response.Dump(&slices);
    response_bytes->clear();
    for (const grpc::Slice& s : slices) {
      response_bytes->append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return status;
}

int HealthStatus(grpc::Channel& channel, const std::string& service) {
  // HealthCheckRequest { string service = 1; }
  std::string request;
  if (!service.empty()) {
    request.push_back(0x0a);
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  std::string response;
  grpc::Status s = RawUnaryCall(channel, "/grpc.health.v1.Health/Check", request, &response);
  if (!s.ok()) return -1;
  // HealthCheckResponse { ServingStatus status = 1; }: 08 <status>
  if (response.size() == 2 && response[0] == 0x08) return response[1];
  return response.empty() ? 0 : -1;
}

grpc::Status UploadParams(v1::Kiln::Stub& stub, const std::string& session,
                          const std::map<std::string, HostTensor>& params, int64_t chunk_bytes,
                          const std::string& api_key, v1::SetParamsResponse* response) {
  auto ctx = Context(api_key);
  v1::SetParamsResponse local;
  auto writer = stub.SetParams(ctx.get(), response ? response : &local);
  bool first = true;
  for (const auto& [name, t] : params) {
    const std::string_view bytes = t.bytes();
    int64_t offset = 0;
    do {
      v1::SetParamsChunk c;
      if (first) c.set_session_id(session);
      first = false;
      if (offset == 0) {
        c.set_name(name);
        c.set_dtype(t.dtype());
        for (int64_t d : t.dims()) c.add_dims(d);
      }
      const int64_t len = std::min<int64_t>(chunk_bytes, static_cast<int64_t>(bytes.size()) - offset);
      c.set_offset(offset);
      c.set_data(std::string(bytes.substr(offset, len)));
      offset += len;
      if (!writer->Write(c)) return writer->Finish();
    } while (offset < static_cast<int64_t>(bytes.size()));
  }
  writer->WritesDone();
  return writer->Finish();
}

grpc::Status RawClientStream(grpc::Channel& channel, const std::string& method,
                             const std::vector<std::string>& messages) {
  grpc::GenericStub stub(channel.shared_from_this());
  auto ctx = Context("", absl::Seconds(30));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(ctx.get(), method, &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](intptr_t want) {
    return cq.Next(&tag, &ok) && tag == reinterpret_cast<void*>(want) && ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool open = step(1);
  for (const std::string& m : messages) {
    if (!open) break;
    grpc::Slice slice(m);
    grpc::ByteBuffer buffer(&slice, 1);
    call->Write(buffer, reinterpret_cast<void*>(2));
    open = step(2);
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(3));
    step(3);
  }
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(4));
  step(4);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  return status;
}

std::vector<std::string> ReflectionServices(grpc::Channel& channel) {
  grpc::GenericStub stub(channel.shared_from_this());
  auto ctx = Context("", absl::Seconds(30));
  grpc::CompletionQueue cq;
  auto call = stub.PrepareCall(ctx.get(), "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
  void* tag = nullptr;
  bool ok = false;
  auto step = [&](void* want) { return cq.Next(&tag, &ok) && tag == want && ok; };
  std::vector<std::string> names;
  call->StartCall(reinterpret_cast<void*>(1));
  if (!step(reinterpret_cast<void*>(1))) return names;
  // ServerReflectionRequest { string list_services = 7; } = "*"
  const std::string request("\x3a\x01*", 3);
  grpc::Slice slice(request);
  grpc::ByteBuffer buffer(&slice, 1);
  call->WriteLast(buffer, grpc::WriteOptions(), reinterpret_cast<void*>(2));
  if (!step(reinterpret_cast<void*>(2))) return names;
  grpc::ByteBuffer reply;
  call->Read(&reply, reinterpret_cast<void*>(3));
  if (!step(reinterpret_cast<void*>(3))) return names;
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(4));
  cq.Next(&tag, &ok);
  std::vector<grpc::Slice> slices;
  reply.Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // Service names are the strings that look like "package.Service".
  for (const std::string candidate : {"kiln.v1.Kiln", "grpc.health.v1.Health",
                                      "grpc.reflection.v1alpha.ServerReflection"}) {
    if (bytes.find(candidate) != std::string::npos) names.push_back(candidate);
  }
  return names;
}

}  // namespace kiln::testing
