#include "server/service.h"

#include <grpcpp/support/proto_buffer_reader.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/passes/qat.h"
#include "engine/train/train_step.h"
#include "server/limits.h"
#include "server/rpc_common.h"
#include "server/tls.h"
#include "server/unix_listener.h"

namespace kiln::server {
namespace {

std::optional<std::string_view> Metadata(grpc::CallbackServerContext* ctx, const char* key) {
  const auto& md = ctx->client_metadata();
  auto it = md.find(key);
  if (it == md.end()) return std::nullopt;
  return std::string_view(it->second.data(), it->second.size());
}

// Printable ASCII stays, the rest (newlines, NULs, quotes, backslashes,
// non-ASCII bytes) is C-escaped, so a log line is one line with one meaning.
std::string LogSafe(absl::string_view s) {
  return EscapeClientBytes(std::string_view(s.data(), s.size()));
}

// A client's own request id is kept when it is short and plain.
bool UsableRequestId(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' &&
        c != ':') {
      return false;
    }
  }
  return true;
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  std::string message(status.message());
  if (message.size() > kMaxStatusMessageBytes) {
    // Cut on a UTF-8 boundary: gRPC percent-encodes the message, clients decode UTF-8.
    size_t cut = kMaxStatusMessageBytes;
    while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xc0) == 0x80) --cut;
    message = absl::StrCat(message.substr(0, cut), "... (message cut, ", message.size() - cut,
                           " more bytes)");
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::move(message));
}

void ScopeCacheReport(const TenantRegistry& tenants, Tenant& tenant, v1::CompileReport& report) {
  const bool known = tenant.NoteExecutable(report.executable_key());
  if (!known && !tenants.open()) {
    const v1::CacheOutcome o = report.executable_cache();
    if (o == v1::CACHE_HIT_MEMORY || o == v1::CACHE_HIT_DISK) {
      report.set_executable_cache(v1::CACHE_MISS);
    }
    report.set_kernel_cache_misses(report.kernel_cache_hits() + report.kernel_cache_misses());
    report.set_kernel_cache_hits(0);
  }
  tenant.CountCacheOutcome(report.executable_cache());
}

void KilnService::StartDraining() {
  absl::MutexLock lock(&calls_mu_);
  draining_ = true;
}

bool KilnService::WaitForCalls(absl::Time deadline) {
  absl::MutexLock lock(&calls_mu_);
  return calls_mu_.AwaitWithDeadline(
      absl::Condition(
          +[](int64_t* active) { return *active == 0; }, &active_calls_),
      deadline);
}

bool KilnService::idle() const {
  absl::MutexLock lock(&calls_mu_);
  return active_calls_ == 0;
}

absl::Status KilnService::Begin(grpc::CallbackServerContext* ctx, const char* method,
                                int64_t request_bytes, Call& call) {
  calls_begun_.fetch_add(1, std::memory_order_relaxed);
  call.method = method;
  call.start = absl::Now();
  if (auto id = Metadata(ctx, "x-request-id"); id && UsableRequestId(*id)) {
    call.request_id = std::string(*id);
  } else {
    call.request_id = absl::StrFormat("%06x-%d", boot_tag_, next_request_.fetch_add(1));
  }
  ctx->AddInitialMetadata("x-request-id", call.request_id);
  PeerIdentity peer = PeerIdentityOf(*ctx);
  peer.unix_uid = UnixListener::PeerUid(ctx->peer());
  auto tenant = deps_.tenants->Authenticate(Metadata(ctx, "authorization"), peer);
  if (!tenant.ok()) return tenant.status();
  call.tenant = *tenant;
  return Admit(method, request_bytes, call);
}

absl::Status KilnService::BeginLocal(Tenant* tenant, const char* method, int64_t request_bytes,
                                     std::string_view request_id, Call& call) {
  calls_begun_.fetch_add(1, std::memory_order_relaxed);
  call.method = method;
  call.start = absl::Now();
  call.request_id = UsableRequestId(request_id)
                        ? std::string(request_id)
                        : absl::StrFormat("%06x-%d", boot_tag_, next_request_.fetch_add(1));
  call.tenant = tenant;
  return Admit(method, request_bytes, call);
}

absl::Status KilnService::Admit(const char* method, int64_t request_bytes, Call& call) {
  if (request_bytes > 0) {
    if (auto s = call.tenant->CheckRequestBytes(request_bytes, method); !s.ok()) return s;
  }
  absl::MutexLock lock(&calls_mu_);
  if (draining_) {
    return absl::UnavailableError(
        "kilnd is shutting down and accepts no new work; retry against a running kilnd");
  }
  ++active_calls_;
  call.admitted = true;
  return absl::OkStatus();
}

void KilnService::End(Call& call, const absl::Status& status) {
  const std::string code = absl::StatusCodeToString(status.code());
  const std::string tenant = call.tenant ? call.tenant->name() : "-";
  deps_.metrics->CountRequest(call.tenant ? tenant : "unauthenticated", call.method, code);
  const double ms = absl::ToDoubleMilliseconds(absl::Now() - call.start);
  // One event, one line: whatever a client put in the detail or the message
  // (names, ids, graph text) is escaped, and the message is bounded.
  const std::string detail = LogSafe(call.detail);
  if (status.ok()) {
    spdlog::info("req={} tenant={} rpc={} code=OK ms={:.3f}{}{}", call.request_id, tenant,
                 call.method, ms, detail.empty() ? "" : " ", detail);
  } else {
    const bool ours = status.code() == absl::StatusCode::kInternal ||
                      status.code() == absl::StatusCode::kUnknown ||
                      status.code() == absl::StatusCode::kDataLoss;
    spdlog::log(ours ? spdlog::level::err : spdlog::level::info,
                "req={} tenant={} rpc={} code={} ms={:.3f}{}{} error=\"{}\"", call.request_id,
                tenant, call.method, code, ms, detail.empty() ? "" : " ", detail,
                LogSafe(status.message().substr(0, kMaxStatusMessageBytes)));
  }
  if (call.admitted) {
    absl::MutexLock lock(&calls_mu_);
    --active_calls_;
    call.admitted = false;
  }
}

absl::Status ParseMessage(const grpc::ByteBuffer& bytes, google::protobuf::Message& message,
                          const std::string& what) {
  grpc::ByteBuffer view(bytes);  // shares the slices
  grpc::ProtoBufferReader reader(&view);
  if (reader.status().ok() && message.ParseFromZeroCopyStream(&reader)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " is not a valid ", message.GetTypeName(),
                                                 ": its ", bytes.Length(),
                                                 " bytes do not parse as that protobuf message"));
}

CompileOptions ToEngineOptions(const v1::CompileOptions& options) {
  CompileOptions o;
  o.device = options.device().empty() ? "auto" : options.device();
  o.prefer_common_ir = options.prefer_common_ir();
  o.enable_fusion = !options.disable_fusion();
  o.allow_tf32 = options.allow_tf32();
  o.allow_int8_activations = options.allow_int8_activations();
  o.cuda_graphs = options.cuda_graphs();
  o.transforms = options.transforms();
  return o;
}

void SignatureToProto(const GraphSignature& signature, v1::Signature* out) {
  auto fill = [](const std::vector<GraphSignature::Entry>& from,
                 google::protobuf::RepeatedPtrField<v1::SignatureEntry>* to) {
    for (const auto& e : from) {
      v1::SignatureEntry* s = to->Add();
      s->set_name(e.name);
      *s->mutable_type() = e.type;
    }
  };
  fill(signature.inputs, out->mutable_inputs());
  fill(signature.params, out->mutable_params());
  fill(signature.outputs, out->mutable_outputs());
}

int64_t ArenaBytes(const v1::CompileReport& report) {
  int64_t bytes = 0;
  for (const v1::MemoryPlanSummary& m : report.memory()) bytes += m.arena_bytes();
  return bytes;
}

std::string ShapeKey(const std::vector<TensorRef>& inputs) {
  std::vector<const TensorRef*> sorted;
  for (const TensorRef& t : inputs) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(),
            [](const TensorRef* a, const TensorRef* b) { return a->name < b->name; });
  std::string key;
  for (const TensorRef* t : sorted) absl::StrAppend(&key, t->name, ":", DimsToString(t->dims), ";");
  return key;
}

}  // namespace kiln::server

namespace kiln::server {

absl::Status CheckDevice(const Engine& engine, const std::string& device) {
  if (device.empty() || device == "auto") return absl::OkStatus();
  std::string ids;
  for (const backend::DeviceInfo* d : engine.Devices()) {
    if (d->id == device) return absl::OkStatus();
    absl::StrAppend(&ids, ids.empty() ? "" : ", ", d->id);
  }
  return absl::InvalidArgumentError(absl::StrCat("options.device ", QuoteClientString(device),
                                                 " is not a device of this kilnd; devices: ", ids,
                                                 " (or auto)"));
}

std::string InputList(const GraphSignature& signature) {
  std::string out;
  for (const auto& in : signature.inputs) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", in.name, ": ", TypeString(in.type));
  }
  return out.empty() ? "none" : out;
}

std::string CacheOutcomeName(v1::CacheOutcome outcome) {
  std::string name = v1::CacheOutcome_Name(outcome);
  if (name.starts_with("CACHE_")) name = name.substr(6);
  absl::AsciiStrToLower(&name);
  return name;
}

namespace {

// dims against a declared type: same rank, concrete dims equal.
bool DimsFit(const v1::TensorType& declared, const Dims& dims) {
  if (declared.dims_size() != static_cast<int>(dims.size())) return false;
  for (int i = 0; i < declared.dims_size(); ++i) {
    const v1::Dim& d = declared.dims(i);
    if (d.has_size() && d.size() != dims[i]) return false;
  }
  return true;
}

}  // namespace

absl::Status CheckParamAgainst(const GraphSignature& signature, const std::string& name,
                               DType dtype, const Dims& dims) {
  for (const auto& p : signature.params) {
    if (p.name != name) continue;
    if (p.type.dtype() != dtype || !DimsFit(p.type, dims)) {
      return absl::InvalidArgumentError(absl::StrCat("param \"", name, "\" is ", TypeString(p.type),
                                                     " in the graph, got ", DTypeName(dtype),
                                                     DimsToString(dims)));
    }
    return absl::OkStatus();
  }
  std::string names;
  for (const auto& p : signature.params) absl::StrAppend(&names, names.empty() ? "" : ", ", p.name);
  return absl::InvalidArgumentError(absl::StrCat(QuoteClientString(name),
                                                 " is not a param of the graph; its ",
                                                 "params: ", names.empty() ? "none" : names));
}

bool IsLsqScaleOf(const GraphSignature& signature, std::string_view name) {
  if (!name.ends_with(passes::kLsqScaleSuffix)) return false;
  const std::string_view param = name.substr(0, name.size() - std::strlen(passes::kLsqScaleSuffix));
  for (const auto& p : signature.params) {
    if (p.name == param) return true;
  }
  return false;
}

absl::Status CheckOptimizerStateAgainst(const GraphSignature& signature, const std::string& name,
                                        DType dtype, const Dims& dims, bool lsq_scales) {
  if (name == train::kStepParam || name == train::kGoodStepsParam ||
      name == train::kSkippedStepsParam) {
    if (dtype != v1::DTYPE_I64 || !dims.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state \"", name, "\" is i64[] (",
                       name == train::kStepParam ? "the steps taken" : "a count of steps",
                       "), got ", DTypeName(dtype), DimsToString(dims)));
    }
    return absl::OkStatus();
  }
  if (name == train::kLossScaleParam) {  // AMP's dynamic loss scale
    if (dtype != v1::DTYPE_F32 || !dims.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state \"", name,
                                                     "\" is f32[] (the loss scale), got ",
                                                     DTypeName(dtype), DimsToString(dims)));
    }
    return absl::OkStatus();
  }
  const std::string_view rest = std::string_view(name).substr(std::strlen(train::kStatePrefix));
  const size_t slash = rest.rfind('/');
  const std::string_view what = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
  if (slash == std::string_view::npos || (what != "m" && what != "v" && what != "momentum")) {
    return absl::InvalidArgumentError(absl::StrCat(
        QuoteClientString(name),
        " is no optimizer state: state is opt/step, opt/<param>/m, /v or /momentum, or AMP's "
        "opt/loss_scale, opt/loss_scale_good_steps and opt/skipped_steps"));
  }
  const std::string param(rest.substr(0, slash));
  if (lsq_scales && IsLsqScaleOf(signature, param)) {
    if (dtype != v1::DTYPE_F32) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state ", QuoteClientString(name),
                                                     " of a learned QAT scale must be f32, got ",
                                                     DTypeName(dtype), DimsToString(dims)));
    }
    return absl::OkStatus();
  }
  for (const auto& p : signature.params) {
    if (p.name != param) continue;
    if (p.type.dtype() != dtype || !DimsFit(p.type, dims)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "optimizer state ", QuoteClientString(name), " must have the type of param \"", param,
          "\" (", TypeString(p.type), "), got ", DTypeName(dtype), DimsToString(dims)));
    }
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer state ", QuoteClientString(name), " names no param of the graph"));
}

absl::Status CheckInputsAgainst(const GraphSignature& signature,
                                const std::vector<TensorRef>& inputs) {
  for (const TensorRef& t : inputs) {
    const GraphSignature::Entry* decl = nullptr;
    for (const auto& in : signature.inputs) {
      if (in.name == t.name) decl = &in;
    }
    if (decl == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(QuoteClientString(t.name),
                                                     " is not an input of the graph; ",
                                                     "its inputs: ", InputList(signature)));
    }
    if (decl->type.dtype() != t.dtype || !DimsFit(decl->type, t.dims)) {
      return absl::InvalidArgumentError(absl::StrCat("input \"", t.name, "\" must be ",
                                                     TypeString(decl->type), ", got ",
                                                     DTypeName(t.dtype), DimsToString(t.dims)));
    }
  }
  for (const auto& in : signature.inputs) {
    bool given = false;
    for (const TensorRef& t : inputs) given = given || t.name == in.name;
    if (!given) {
      return absl::InvalidArgumentError(
          absl::StrCat("missing input \"", in.name, "\" (", TypeString(in.type), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace kiln::server
