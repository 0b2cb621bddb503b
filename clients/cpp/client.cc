#include "clients/cpp/client.h"

#include <malloc.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "clients/cpp/shm.h"
#include "base/status.h"
#include "base/tensor_wire.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

namespace kiln {
namespace {

// RunRequest.inputs / params and RunResponse.outputs (proto/kiln/v1/service.proto).
constexpr int kRunRequestInputs = 4;
constexpr int kRunRequestParams = 5;
constexpr int kRunResponseOutputs = 1;

void ToNamedTensors(const TensorMap& tensors,
                    google::protobuf::RepeatedPtrField<v1::NamedTensor>* out) {
  out->Reserve(static_cast<int>(tensors.size()));
  for (const auto& [name, t] : tensors) {
    v1::NamedTensor* nt = out->Add();
    nt->set_name(name);
    t.ToProto(nt->mutable_tensor());
  }
}

}  // namespace

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

v1::GraphSource GraphFromProto(v1::Graph graph) {
  v1::GraphSource s;
  *s.mutable_graph() = std::move(graph);
  return s;
}

v1::GraphSource GraphFromText(std::string text) {
  v1::GraphSource s;
  s.set_text(std::move(text));
  return s;
}

const HostTensor* ClientRunResult::output(const std::string& name) const {
  for (const auto& [n, t] : outputs) {
    if (n == name) return &t;
  }
  return nullptr;
}

bool TuneMallocForLargeTensors() {
  const bool mmap_ok = mallopt(M_MMAP_THRESHOLD, 32 << 20) == 1;
  const bool trim_ok = mallopt(M_TRIM_THRESHOLD, 128 << 20) == 1;
  return mmap_ok && trim_ok;
}

namespace {

absl::StatusOr<std::string> ReadTlsFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read the ", what, " file \"", path, "\""));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool EnvTrue(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return false;
  const std::string s = absl::AsciiStrToLower(v);
  return s == "1" || s == "true" || s == "yes" || s == "on";
}

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::string(v) : fallback;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const ClientOptions& options) {
  const bool tls = options.tls || !options.ca_file.empty() || !options.cert_file.empty() ||
                   !options.key_file.empty();
  if (!tls) return grpc::InsecureChannelCredentials();
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        "a client certificate needs its key: give both cert_file and key_file (--cert and --key, "
        "KILN_CERT and KILN_KEY) or neither");
  }
  grpc::SslCredentialsOptions ssl;
  if (!options.ca_file.empty()) {
    KILN_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadTlsFile(options.ca_file, "CA"));
  }
  if (!options.cert_file.empty()) {
    KILN_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadTlsFile(options.cert_file, "client certificate"));
    KILN_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadTlsFile(options.key_file, "client key"));
  }
  return grpc::SslCredentials(ssl);
}

}  // namespace

ClientOptions ClientOptions::FromEnvironment() {
  ClientOptions o;
  o.api_key = EnvOr("KILN_API_KEY", o.api_key);
  o.tls = EnvTrue("KILN_TLS");
  o.ca_file = EnvOr("KILN_CA", "");
  o.cert_file = EnvOr("KILN_CERT", "");
  o.key_file = EnvOr("KILN_KEY", "");
  o.tls_server_name = EnvOr("KILN_TLS_SERVER_NAME", "");
  return o;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const std::string& addr,
                                                       const ClientOptions& options) {
  if (addr.empty()) return absl::InvalidArgumentError("empty server address");
  if (options.chunk_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes must be positive, got ", options.chunk_bytes));
  }
  grpc::ChannelArguments args;
  // Outputs and GetParams chunks are bounded by the server's limits, not ours.
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                        ChannelCredentials(options));
  if (!options.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options.tls_server_name);
  }
  auto channel = grpc::CreateCustomChannel(addr, credentials, args);
  return std::unique_ptr<Client>(new Client(addr, options, std::move(channel)));
}

// Shared memory with a local kilnd: one connection to its socket, and a
// pool of regions, each serving one call at a time (inputs from its start,
// the output area after them).
struct Client::Shm {
  absl::Mutex mu;
  std::shared_ptr<ShmConnection> connection ABSL_GUARDED_BY(mu);
  std::vector<std::unique_ptr<ShmRegion>> idle ABSL_GUARDED_BY(mu);  // not in a call
  absl::Time retry_after ABSL_GUARDED_BY(mu) = absl::InfinitePast();  // after a failed connect
  int64_t output_bytes_hint ABSL_GUARDED_BY(mu) = 0;  // outputs that did not fit last time
  std::atomic<uint64_t> next_id = 0;

  static constexpr size_t kMaxIdle = 4;
  static constexpr int64_t kMinRegionBytes = int64_t{1} << 20;
};

namespace {

int64_t Align64(int64_t n) { return (n + 63) / 64 * 64; }

bool Off(const char* variable) {
  const char* v = std::getenv(variable);
  if (v == nullptr) return false;
  const std::string s = absl::AsciiStrToLower(v);
  return s == "0" || s == "false" || s == "no" || s == "off";
}

bool ShmDisabledByEnvironment() { return Off("KILN_SHM"); }

}  // namespace

Client::Client(std::string addr, ClientOptions options, std::shared_ptr<grpc::Channel> channel)
    : addr_(std::move(addr)),
      options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::Kiln::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)),
      shm_(options_.shared_memory && IsLocalTarget(addr_) && !ShmDisabledByEnvironment()
               ? std::make_unique<Shm>()
               : nullptr) {}

Client::~Client() {
  if (shm_) {
    absl::MutexLock lock(&shm_->mu);
    shm_->idle.clear();
    shm_->connection.reset();
  }
}

std::unique_ptr<grpc::ClientContext> Client::NewContext() const {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (!options_.api_key.empty()) ctx->AddMetadata("authorization", "Bearer " + options_.api_key);
  if (options_.timeout != absl::InfiniteDuration()) {
    ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  }
  return ctx;
}

absl::StatusOr<v1::CompileResponse> Client::Compile(
    const v1::GraphSource& graph, const v1::CompileOptions& options,
    const std::vector<std::pair<std::string, Dims>>& input_shapes) const {
  v1::CompileRequest req;
  *req.mutable_graph() = graph;
  *req.mutable_options() = options;
  for (const auto& [name, dims] : input_shapes) {
    v1::InputShape* s = req.add_input_shapes();
    s->set_name(name);
    for (int64_t d : dims) s->add_dims(d);
  }
  v1::CompileResponse resp;
  auto ctx = NewContext();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(stub_->Compile(ctx.get(), req, &resp)));
  return resp;
}

absl::StatusOr<v1::CreateSessionResponse> Client::CreateSession(
    const v1::GraphSource& graph, const v1::CompileOptions& options, const TensorMap& params,
    const std::vector<std::pair<std::string, std::string>>& state) const {
  v1::CreateSessionRequest req;
  *req.mutable_graph() = graph;
  *req.mutable_options() = options;
  ToNamedTensors(params, req.mutable_params());
  for (const auto& [output, param] : state) {
    v1::StateBinding* b = req.add_state();
    b->set_output(output);
    b->set_param(param);
  }
  v1::CreateSessionResponse resp;
  auto ctx = NewContext();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(stub_->CreateSession(ctx.get(), req, &resp)));
  return resp;
}

absl::StatusOr<v1::SetParamsResponse> Client::SetParams(const std::string& session_id,
                                                        const TensorMap& params,
                                                        const ProgressFn& progress) const {
  int64_t total = 0;
  for (const auto& [name, t] : params) total += t.num_bytes();
  v1::SetParamsResponse resp;
  auto ctx = NewContext();
  std::unique_ptr<grpc::ClientWriter<v1::SetParamsChunk>> writer =
      stub_->SetParams(ctx.get(), &resp);
  int64_t done = 0;
  bool first = true;
  bool broken = false;
  v1::SetParamsChunk chunk;
  for (const auto& [name, t] : params) {
    // The first chunk of each param names it with its type; the rest carry
    // only their byte range. An empty param still sends its naming chunk.
    const std::string_view bytes = t.bytes();
    int64_t offset = 0;
    do {
      const int64_t n =
          std::min<int64_t>(options_.chunk_bytes, static_cast<int64_t>(bytes.size()) - offset);
      chunk.Clear();
      if (first) chunk.set_session_id(session_id);
      if (offset == 0) {
        chunk.set_name(name);
        chunk.set_dtype(t.dtype());
        for (int64_t d : t.dims()) chunk.add_dims(d);
      }
      chunk.set_offset(offset);
      chunk.set_data(bytes.data() + offset, static_cast<size_t>(n));
      if (!writer->Write(chunk)) {
        broken = true;  // the server ended the stream; Finish says why
        break;
      }
      first = false;
      offset += n;
      done += n;
      if (progress) progress(done, total);
    } while (offset < static_cast<int64_t>(bytes.size()));
    if (broken) break;
  }
  if (first && !broken) {
    // No params at all: still name the session so the server can answer.
    chunk.Clear();
    chunk.set_session_id(session_id);
    writer->Write(chunk);
  }
  writer->WritesDone();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(writer->Finish()));
  return resp;
}

absl::StatusOr<TensorMap> Client::GetParams(const std::string& session_id,
                                            const std::vector<std::string>& names) const {
  v1::GetParamsRequest req;
  req.set_session_id(session_id);
  for (const std::string& n : names) req.add_names(n);
  auto ctx = NewContext();
  std::unique_ptr<grpc::ClientReader<v1::ParamChunk>> reader = stub_->GetParams(ctx.get(), req);
  TensorMap out;
  HostTensor* current = nullptr;
  std::string current_name;
  absl::Status bad;
  v1::ParamChunk chunk;
  while (reader->Read(&chunk)) {
    if (!bad.ok()) continue;  // drain, then report the first problem
    const bool starts =
        !chunk.name().empty() && (chunk.name() != current_name || chunk.offset() == 0);
    if (starts) {
      if (out.contains(chunk.name())) {
        bad = absl::DataLossError(absl::StrCat("GetParams: param '", chunk.name(), "' sent twice"));
        continue;
      }
      auto t = HostTensor::Create(chunk.dtype(), Dims(chunk.dims().begin(), chunk.dims().end()));
      if (!t.ok()) {
        bad = absl::DataLossError(
            absl::StrCat("GetParams: param '", chunk.name(), "': ", t.status().message()));
        continue;
      }
      current_name = chunk.name();
      current = &out.emplace(current_name, std::move(*t)).first->second;
    }
    if (current == nullptr) {
      bad = absl::DataLossError("GetParams: a chunk arrived before any param was named");
      continue;
    }
    const int64_t end = chunk.offset() + static_cast<int64_t>(chunk.data().size());
    if (chunk.offset() < 0 || end > current->num_bytes()) {
      bad = absl::DataLossError(absl::StrCat("GetParams: chunk [", chunk.offset(), ", ", end,
                                             ") is outside param '", current_name, "' of ",
                                             current->num_bytes(), " bytes"));
      continue;
    }
    if (!chunk.data().empty()) {
      std::memcpy(static_cast<char*>(current->data()) + chunk.offset(), chunk.data().data(),
                  chunk.data().size());
    }
  }
  KILN_RETURN_IF_ERROR(FromGrpcStatus(reader->Finish()));
  KILN_RETURN_IF_ERROR(bad);
  return out;
}

absl::StatusOr<Client::RunResult> Client::DoRun(v1::RunRequest& req, const TensorMap& inputs,
                                                const TensorMap& params) const {
  if (shm_) {
    // Inputs through shared memory when it is on and works (params, rarely
    // large on a Run, stay in the message), else as bytes. No copy of the
    // request (a one-shot Run carries its whole graph): RunWithShm takes back
    // what it added when it declines, and the params go here.
    ToNamedTensors(params, req.mutable_params());
    if (std::optional<absl::StatusOr<RunResult>> r = RunWithShm(req, inputs)) {
      return *std::move(r);
    }
    req.clear_params();
  }
  return RunWithBytes(req, inputs, params);
}

std::optional<Client::ShmLease> Client::AcquireShm(int64_t input_bytes, bool outputs) const {
  std::unique_ptr<ShmRegion> region;
  std::shared_ptr<ShmConnection> connection;
  int64_t want = 0;
  {
    absl::MutexLock lock(&shm_->mu);
    want = input_bytes +
           (outputs ? std::max<int64_t>(shm_->output_bytes_hint, input_bytes) : int64_t{0});
    if (!shm_->connection) {
      if (absl::Now() < shm_->retry_after) return std::nullopt;
      auto ctx = NewContext();
      absl::StatusOr<std::shared_ptr<ShmConnection>> c = ShmConnection::Connect(*stub_, *ctx);
      if (!c.ok()) {
        // kilnd without shared memory, or out of reach: bytes for a while.
        shm_->retry_after = absl::Now() + absl::Seconds(30);
        return std::nullopt;
      }
      shm_->connection = *std::move(c);
    }
    connection = shm_->connection;
    for (auto it = shm_->idle.begin(); it != shm_->idle.end(); ++it) {
      if ((*it)->bytes() >= want) {
        region = std::move(*it);
        shm_->idle.erase(it);
        break;
      }
    }
  }
  if (!region) {
    const int64_t bytes = std::max(Shm::kMinRegionBytes, (want + want / 4 + 4095) / 4096 * 4096);
    absl::StatusOr<std::unique_ptr<ShmRegion>> r = connection->CreateRegion(
        absl::StrCat("kiln-", ::getpid(), "-", shm_->next_id.fetch_add(1), "-",
                     reinterpret_cast<uintptr_t>(this) % 100000),
        bytes);
    if (!r.ok()) {
      if (r.status().code() == absl::StatusCode::kUnavailable) {
        absl::MutexLock lock(&shm_->mu);
        if (shm_->connection == connection) shm_->connection.reset();  // kilnd went away
      }
      return std::nullopt;  // e.g. the tenant's shm quota is full: bytes this time
    }
    region = *std::move(r);
  }
  return ShmLease{std::move(region), std::move(connection)};
}

int64_t Client::PlaceInShm(const TensorMap& inputs, ShmRegion& region,
                           google::protobuf::RepeatedPtrField<v1::NamedTensor>& named) {
  int64_t offset = 0;
  for (const auto& [name, t] : inputs) {
    v1::NamedTensor* nt = named.Add();
    nt->set_name(name);
    nt->mutable_tensor()->set_dtype(t.dtype());
    for (int64_t d : t.dims()) nt->mutable_tensor()->add_dims(d);
    if (t.num_bytes() > 0) std::memcpy(region.data() + offset, t.data(), t.num_bytes());
    v1::SharedMemoryRef* ref = nt->mutable_shm();
    ref->set_region_id(region.id());
    ref->set_offset(offset);
    ref->set_bytes(t.num_bytes());
    offset += Align64(t.num_bytes());
  }
  return offset;
}

bool Client::ShmLost(const absl::Status& s, const ShmLease& lease) const {
  if (s.ok() || s.code() != absl::StatusCode::kNotFound ||
      !absl::StrContains(s.message(), "shared-memory region")) {
    return false;
  }
  // kilnd lost the region (it restarted, or the connection dropped):
  // nothing ran; again as bytes, with a new connection next time.
  absl::MutexLock lock(&shm_->mu);
  if (shm_->connection == lease.connection) {
    shm_->connection.reset();
    shm_->idle.clear();
  }
  return true;
}

void Client::ReleaseShm(ShmLease lease) const {
  absl::MutexLock lock(&shm_->mu);
  if (shm_->connection == lease.connection) {
    shm_->idle.push_back(std::move(lease.region));
    if (shm_->idle.size() > Shm::kMaxIdle) shm_->idle.erase(shm_->idle.begin());
  }
}

std::optional<absl::StatusOr<Client::RunResult>> Client::RunWithShm(v1::RunRequest& req,
                                                                    const TensorMap& inputs) const {
  int64_t input_bytes = 0;
  for (const auto& [name, t] : inputs) input_bytes += Align64(t.num_bytes());
  std::optional<ShmLease> lease = AcquireShm(input_bytes, /*outputs=*/true);
  if (!lease) return std::nullopt;
  const std::unique_ptr<ShmRegion>& region = lease->region;
  const int64_t offset = PlaceInShm(inputs, *region, *req.mutable_inputs());
  v1::SharedMemoryRef* area = req.mutable_shm_output_area();
  area->set_region_id(region->id());
  area->set_offset(offset);
  area->set_bytes(region->bytes() - offset);
  v1::RunResponse resp;
  absl::Status s;
  bool over_socket = false;
  if (options_.shm_runs && !Off("KILN_SHM_RUN")) {
    const absl::Time deadline = options_.timeout == absl::InfiniteDuration()
                                    ? absl::InfiniteFuture()
                                    : absl::Now() + options_.timeout;
    std::optional<absl::StatusOr<v1::RunResponse>> r = lease->connection->TryRun(req, deadline);
    if (r && !r->ok() && r->status().code() == absl::StatusCode::kResourceExhausted &&
        absl::StartsWith(r->status().message(), "nothing ran: ")) {
      // Outputs that would come back as bytes do not fit a datagram (the
      // region's output area is too small for them): gRPC this time, which
      // sizes the next region for them.
      r.reset();
    }
    if (r) {
      over_socket = true;
      if (r->ok()) {
        resp = **std::move(r);
      } else {
        s = r->status();
      }
      if (s.code() == absl::StatusCode::kUnavailable) {
        // The socket broke (kilnd went away or restarted): a new connection next time.
        absl::MutexLock lock(&shm_->mu);
        if (shm_->connection == lease->connection) {
          shm_->connection.reset();
          shm_->idle.clear();
        }
      }
    }
  }
  if (!over_socket) {
    auto ctx = NewContext();
    s = FromGrpcStatus(stub_->Run(ctx.get(), req, &resp));
  }
  if (ShmLost(s, *lease)) {
    req.clear_inputs();
    req.clear_shm_output_area();
    return std::nullopt;
  }
  absl::StatusOr<RunResult> result = absl::UnknownError("unset");
  if (!s.ok()) {
    result = s;
  } else {
    RunResult out;
    out.shared_memory = true;
    out.shm_run = over_socket;
    int64_t output_bytes = 0;
    bool all_in_shm = true;
    for (const v1::NamedTensor& nt : resp.outputs()) {
      if (!nt.has_shm()) {
        all_in_shm = false;
        auto t = HostTensor::FromProto(nt.tensor());
        if (!t.ok()) {
          return absl::DataLossError(
              absl::StrCat("Run: output '", nt.name(), "' is malformed: ", t.status().message()));
        }
        output_bytes += Align64(t->num_bytes());
        out.outputs.emplace_back(nt.name(), std::move(*t));
        continue;
      }
      const v1::SharedMemoryRef& ref = nt.shm();
      auto t = HostTensor::CreateUninitialized(nt.tensor().dtype(),
                                               Dims(nt.tensor().dims().begin(), nt.tensor().dims().end()));
      if (!t.ok() || ref.region_id() != region->id() || ref.offset() < 0 ||
          ref.bytes() != t->num_bytes() || ref.offset() > region->bytes() - ref.bytes()) {
        return absl::DataLossError(absl::StrCat("Run: output '", nt.name(),
                                                "' names shared memory this call did not give"));
      }
      if (ref.bytes() > 0) std::memcpy(t->data(), region->data() + ref.offset(), ref.bytes());
      output_bytes += Align64(ref.bytes());
      out.outputs.emplace_back(nt.name(), std::move(*t));
    }
    if (resp.has_report()) out.report = std::move(*resp.mutable_report());
    out.request_id = resp.request_id();
    result = std::move(out);
    absl::MutexLock lock(&shm_->mu);
    if (!all_in_shm) shm_->output_bytes_hint = std::max(shm_->output_bytes_hint, output_bytes);
  }
  ReleaseShm(*std::move(lease));
  return result;
}

namespace {

// Inputs and params at least this long are sent from the caller's buffers;
// shorter ones are copied (a slice of their own costs more than the copy).
constexpr int64_t kSendInPlaceMinBytes = int64_t{64} << 10;

// Tensor data that gRPC sends straight from the caller's buffers: each such
// slice holds one count of `pending`, released when gRPC drops its last
// reference; RunWithBytes returns only after every count is back.
struct SendHold {
  absl::Mutex mu;
  int pending ABSL_GUARDED_BY(mu) = 0;
};

// Await's condition (called with mu held).
bool NothingPending(SendHold* hold) { return hold->pending == 0; }

// A grpc::Slice's destroy callback; `holder` is a new'd shared_ptr<SendHold>.
void ReleaseSent(void* holder) {
  auto* hold = static_cast<std::shared_ptr<SendHold>*>(holder);
  {
    absl::MutexLock lock(&(*hold)->mu);
    --(*hold)->pending;
  }
  delete hold;  // the hold itself lives on while RunWithBytes waits on it
}

}  // namespace

// Tensor data crosses the client at most once each way: large inputs go out
// as slices over the caller's own buffers (no copy; the call returns once
// gRPC has let go of them), small ones are copied into gRPC's slices (no
// protobuf string in between), and outputs are copied from the response's
// slices into HostTensors (shaped from the tensor's header, which protobuf
// writes before the data).
absl::StatusOr<Client::RunResult> Client::RunWithBytes(const v1::RunRequest& req,
                                                       const TensorMap& inputs,
                                                       const TensorMap& params) const {
  WirePieces pieces;
  pieces.Append(req.SerializeAsString());
  for (const auto& [field, tensors] : {std::pair{kRunRequestInputs, &inputs},
                                       std::pair{kRunRequestParams, &params}}) {
    for (const auto& [name, t] : *tensors) {
      AppendNamedTensor(field, name, t.dtype(), t.dims(), t.data(), t.num_bytes(),
                        kSendInPlaceMinBytes, pieces);
    }
  }
  if (pieces.size() > static_cast<uint64_t>(INT32_MAX)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Run: the request would be ", pieces.size(),
        " bytes, over protobuf's 2 GiB message limit; send fewer or smaller tensors"));
  }
  grpc::ByteBuffer response;
  grpc::Status call_status;
  auto hold = std::make_shared<SendHold>();
  {
    std::vector<grpc::Slice> slices;
    slices.reserve(pieces.pieces().size());
    for (const WirePieces::Piece& p : pieces.pieces()) {
      if (p.data == nullptr) {
        slices.emplace_back(p.owned.data(), p.owned.size());  // a copy
        continue;
      }
      {
        absl::MutexLock lock(&hold->mu);
        ++hold->pending;
      }
      slices.emplace_back(const_cast<char*>(p.data), p.size, &ReleaseSent,
                          new std::shared_ptr<SendHold>(hold));
    }
    grpc::ByteBuffer request(slices.data(), slices.size());
    slices.clear();
    auto ctx = NewContext();
    const grpc::internal::RpcMethod method("/kiln.v1.Kiln/Run",
                                           grpc::internal::RpcMethod::NORMAL_RPC, channel_);
    call_status = grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
        channel_.get(), method, ctx.get(), request, &response);
  }  // the request and the call drop their references here
  {
    // What is left is in gRPC's transport, which lets go once the bytes are
    // written or the stream is gone: the caller's buffers may not be freed
    // before that.
    absl::MutexLock lock(&hold->mu);
    hold->mu.Await(absl::Condition(&NothingPending, hold.get()));
  }
  KILN_RETURN_IF_ERROR(FromGrpcStatus(call_status));

  std::vector<HostTensor> received;  // by output index; empty: in the message
  std::vector<SplitData> moved;
  grpc::ProtoBufferReader reader(&response);
  absl::StatusOr<std::string> rest = SplitTensorData(
      reader, static_cast<int64_t>(response.Length()), std::span<const int>(&kRunResponseOutputs, 1),
      /*min_bytes=*/0,
      [&received](int, int index, const v1::Tensor& head, int64_t n) -> absl::StatusOr<char*> {
        if (received.size() <= static_cast<size_t>(index)) received.resize(index + 1);
        // Shaped as the header says when it matches the length; else bytes,
        // checked against the final header below.
        const Dims dims(head.dims().begin(), head.dims().end());
        absl::StatusOr<int64_t> elements = CheckedNumElements(dims);
        const std::optional<int64_t> bytes =
            elements.ok() && IsKnownDType(head.dtype()) ? BytesFor(head.dtype(), *elements)
                                                        : std::nullopt;
        absl::StatusOr<HostTensor> t =
            bytes && *bytes == n ? HostTensor::CreateUninitialized(head.dtype(), dims)
                                 : HostTensor::CreateUninitialized(v1::DTYPE_U8, {n});
        if (!t.ok()) return t.status();
        received[index] = std::move(*t);
        return static_cast<char*>(received[index].data());
      },
      &moved);
  v1::RunResponse resp;
  if (!rest.ok() || !resp.ParseFromString(*rest)) {
    return absl::DataLossError(absl::StrCat("Run: the response is not a kiln.v1.RunResponse",
                                            rest.ok() ? "" : ": ", rest.ok() ? "" : rest.status().message()));
  }
  RunResult result;
  result.outputs.reserve(resp.outputs_size());
  for (int i = 0; i < resp.outputs_size(); ++i) {
    const v1::NamedTensor& nt = resp.outputs(i);
    const v1::Tensor& header = nt.tensor();
    absl::StatusOr<HostTensor> t = absl::InternalError("no data");
    if (static_cast<size_t>(i) < received.size() && received[i].data() != nullptr) {
      HostTensor& got = received[i];
      if (got.dtype() == header.dtype() &&
          std::equal(got.dims().begin(), got.dims().end(), header.dims().begin(), header.dims().end())) {
        t = std::move(got);
      } else {
        t = HostTensor::FromBytes(header.dtype(), Dims(header.dims().begin(), header.dims().end()),
                                  got.bytes());
      }
    } else {
      t = HostTensor::FromProto(header);
    }
    if (!t.ok()) {
      return absl::DataLossError(
          absl::StrCat("Run: output '", nt.name(), "' is malformed: ", t.status().message()));
    }
    result.outputs.emplace_back(nt.name(), std::move(*t));
  }
  if (resp.has_report()) result.report = std::move(*resp.mutable_report());
  result.request_id = resp.request_id();
  return result;
}

absl::StatusOr<Client::RunResult> Client::Run(const std::string& session_id,
                                              const TensorMap& inputs,
                                              const Client::RunOptions& options) const {
  if (session_id.empty()) return absl::InvalidArgumentError("Run: empty session id");
  v1::RunRequest req;
  req.set_session_id(session_id);
  req.set_report(options.report);
  req.set_priority(options.priority);
  return DoRun(req, inputs, {});
}

absl::StatusOr<Client::RunResult> Client::Run(const v1::GraphSource& graph, const TensorMap& inputs,
                                              const TensorMap& params,
                                              const Client::RunOptions& options) const {
  v1::RunRequest req;
  *req.mutable_graph() = graph;
  *req.mutable_options() = options.compile;
  req.set_report(options.report);
  req.set_priority(options.priority);
  return DoRun(req, inputs, params);
}

absl::StatusOr<v1::TrainStepResponse> Client::TrainStep(const std::string& session_id,
                                                        const TensorMap& batch,
                                                        bool* shared_memory,
                                                        bool* over_socket_out) const {
  if (shared_memory) *shared_memory = false;
  if (over_socket_out) *over_socket_out = false;
  if (session_id.empty()) return absl::InvalidArgumentError("TrainStep: empty session id");
  v1::TrainStepRequest req;
  req.set_session_id(session_id);
  v1::TrainStepResponse resp;
  if (shm_ && !train_step_shm_refused_.load()) {
    int64_t batch_bytes = 0;
    for (const auto& [name, t] : batch) batch_bytes += Align64(t.num_bytes());
    // The answer is a few scalars: the region holds the batch only.
    if (std::optional<ShmLease> lease = AcquireShm(batch_bytes, /*outputs=*/false)) {
      PlaceInShm(batch, *lease->region, *req.mutable_inputs());
      absl::Status s;
      bool over_socket = false;
      if (options_.shm_train_steps && !Off("KILN_SHM_TRAIN_STEP")) {
        // Over kilnd's shared-memory socket (docs/training.md "Steps over
        // the socket"); gRPC when it was not sent there.
        const absl::Time deadline = options_.timeout == absl::InfiniteDuration()
                                        ? absl::InfiniteFuture()
                                        : absl::Now() + options_.timeout;
        std::optional<absl::StatusOr<v1::TrainStepResponse>> r =
            lease->connection->TryTrainStep(req, deadline);
        if (r) {
          over_socket = true;
          if (r->ok()) {
            resp = **std::move(r);
          } else {
            s = r->status();
          }
          if (s.code() == absl::StatusCode::kUnavailable) {
            // The socket broke (kilnd went away or restarted): a new connection next time.
            absl::MutexLock lock(&shm_->mu);
            if (shm_->connection == lease->connection) {
              shm_->connection.reset();
              shm_->idle.clear();
            }
          }
        }
      }
      if (!over_socket) {
        auto ctx = NewContext();
        s = FromGrpcStatus(stub_->TrainStep(ctx.get(), req, &resp));
      }
      if (over_socket_out) *over_socket_out = over_socket && s.ok();
      if (!ShmLost(s, *lease)) {
        ReleaseShm(*std::move(lease));
        if (s.ok()) {
          if (shared_memory) *shared_memory = true;
          return resp;
        }
        if (s.code() != absl::StatusCode::kInvalidArgument ||
            !absl::StrContains(s.message(), "names shared memory")) {
          return s;
        }
        // A kilnd from before TrainStep took shared memory: nothing ran;
        // bytes from now on.
        train_step_shm_refused_.store(true);
      }
      req.clear_inputs();
    }
  }
  ToNamedTensors(batch, req.mutable_inputs());
  auto ctx = NewContext();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(stub_->TrainStep(ctx.get(), req, &resp)));
  return resp;
}

absl::StatusOr<std::vector<v1::TrainStepResponse>> Client::TrainSteps(
    const std::string& session_id, std::span<const TensorMap> batches,
    const std::function<void(const v1::TrainStepResponse&)>& on_step) const {
  if (session_id.empty()) return absl::InvalidArgumentError("TrainSteps: empty session id");
  auto ctx = NewContext();
  auto stream = stub_->TrainSteps(ctx.get());
  std::vector<v1::TrainStepResponse> answers;
  // One batch ahead of the answers: kilnd reads and checks batch i+1 while
  // step i runs, and starts it as soon as step i ends.
  auto write = [&](size_t i) {
    v1::TrainStepRequest req;
    if (i == 0) req.set_session_id(session_id);
    ToNamedTensors(batches[i], req.mutable_inputs());
    return stream->Write(req);
  };
  bool writing = !batches.empty() && write(0);
  for (size_t i = 0; i < batches.size(); ++i) {
    if (writing && i + 1 < batches.size()) writing = write(i + 1);
    v1::TrainStepResponse resp;
    if (!stream->Read(&resp)) break;  // the server ended the call: its status says why
    if (on_step) on_step(resp);
    answers.push_back(std::move(resp));
  }
  stream->WritesDone();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(stream->Finish()))
      << "after " << answers.size() << " of " << batches.size() << " steps";
  return answers;
}

absl::Status Client::CloseSession(const std::string& session_id) const {
  v1::CloseSessionRequest req;
  req.set_session_id(session_id);
  v1::CloseSessionResponse resp;
  auto ctx = NewContext();
  return FromGrpcStatus(stub_->CloseSession(ctx.get(), req, &resp));
}

absl::StatusOr<v1::ListModelsResponse> Client::ListModels(const std::string& name) const {
  v1::ListModelsRequest req;
  req.set_name(name);
  v1::ListModelsResponse resp;
  auto ctx = NewContext();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(stub_->ListModels(ctx.get(), req, &resp)));
  return resp;
}

absl::StatusOr<v1::ModelVersionInfo> Client::LoadModel(const std::string& name, int64_t version) const {
  v1::LoadModelRequest req;
  req.set_name(name);
  req.set_version(version);
  v1::LoadModelResponse resp;
  auto ctx = NewContext();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(stub_->LoadModel(ctx.get(), req, &resp)));
  return resp.model();
}

absl::StatusOr<v1::UnloadModelResponse> Client::UnloadModel(const std::string& name, int64_t version) const {
  v1::UnloadModelRequest req;
  req.set_name(name);
  req.set_version(version);
  v1::UnloadModelResponse resp;
  auto ctx = NewContext();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(stub_->UnloadModel(ctx.get(), req, &resp)));
  return resp;
}

absl::StatusOr<v1::ListDevicesResponse> Client::ListDevices() const {
  v1::ListDevicesResponse resp;
  auto ctx = NewContext();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(stub_->ListDevices(ctx.get(), {}, &resp)));
  return resp;
}

absl::StatusOr<std::vector<v1::DispatchReport>> Client::GetReports(int32_t last) const {
  if (last < 0) return absl::InvalidArgumentError(absl::StrCat("last must be >= 0, got ", last));
  v1::GetReportRequest req;
  req.set_last(last);
  v1::GetReportResponse resp;
  auto ctx = NewContext();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(stub_->GetReport(ctx.get(), req, &resp)));
  return std::vector<v1::DispatchReport>(resp.reports().begin(), resp.reports().end());
}

absl::StatusOr<v1::DispatchReport> Client::GetReport(const std::string& request_id) const {
  if (request_id.empty()) return absl::InvalidArgumentError("GetReport: empty request id");
  v1::GetReportRequest req;
  req.set_request_id(request_id);
  v1::GetReportResponse resp;
  auto ctx = NewContext();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(stub_->GetReport(ctx.get(), req, &resp)));
  if (resp.reports_size() == 0) {
    return absl::NotFoundError(absl::StrCat("no report for request ", request_id));
  }
  return std::move(*resp.mutable_reports(0));
}

absl::StatusOr<v1::ServerInfoResponse> Client::ServerInfo() const {
  v1::ServerInfoResponse resp;
  auto ctx = NewContext();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(stub_->ServerInfo(ctx.get(), {}, &resp)));
  return resp;
}

absl::StatusOr<ServingStatus> Client::Health(const std::string& service) const {
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  auto ctx = NewContext();
  KILN_RETURN_IF_ERROR(FromGrpcStatus(health_->Check(ctx.get(), req, &resp)));
  return resp.status();
}

}  // namespace kiln
