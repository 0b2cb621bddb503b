// SetParams (client stream) and GetParams (server stream).
#include <algorithm>
#include <cstring>
#include <deque>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/train/train_step.h"
#include "server/limits.h"
#include "server/rpc_common.h"

namespace kiln::server {
namespace {

// GetParams chunks: 1 MiB unless asked; never more than fits a client's
// default 4 MiB receive limit with the chunk's header.
constexpr int64_t kDefaultChunkBytes = int64_t{1} << 20;
constexpr int64_t kMaxChunkBytes = (int64_t{4} << 20) - (int64_t{64} << 10);

// Receives chunks, assembling each param in host memory charged to the
// tenant before it is allocated; binds them all when the stream ends.
class SetParamsReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  SetParamsReactor(KilnService& service, grpc::CallbackServerContext* ctx,
                   grpc::ByteBuffer* response_bytes)
      : service_(service), ctx_(ctx), response_bytes_(response_bytes) {
    if (absl::Status s = service_.Begin(ctx, "SetParams", 0, call_); !s.ok()) {
      Complete(s);
      return;
    }
    StartRead(&bytes_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the client closed its side (or went away)
      service_.deps().pool->Post([this] { Complete(Commit()); });
      return;
    }
    ++chunks_;
    chunk_.Clear();
    absl::Status s = ParseMessage(bytes_, chunk_, absl::StrCat("chunk ", chunks_));
    if (s.ok()) s = Accept(chunk_);
    if (!s.ok()) {
      Complete(StatusBuilder(s) << "nothing was applied");
      return;
    }
    bytes_.Clear();
    StartRead(&bytes_);
  }

  void OnDone() override {
    if (reserved_ > 0) call_.tenant->ReleaseBytes(reserved_, reserved_);
    delete this;
  }

 private:
  struct Upload {
    std::string name;
    HostTensor data;
    int64_t received = 0;
  };

  std::string Where() const { return absl::StrCat("chunk ", chunks_); }

  absl::Status Accept(const v1::SetParamsChunk& c) {
    const ServiceDeps& d = service_.deps();
    KILN_RETURN_IF_ERROR(call_.tenant->CheckRequestBytes(static_cast<int64_t>(bytes_.Length()),
                                                         "SetParams chunk"));
    d.metrics->ObserveRequestBytes(call_.tenant->name(), "SetParams",
                                   static_cast<int64_t>(bytes_.Length()));
    if (!session_) {
      if (c.session_id().empty()) {
        return absl::InvalidArgumentError("the first SetParams chunk must carry session_id");
      }
      KILN_ASSIGN_OR_RETURN(session_, d.sessions->Find(*call_.tenant, c.session_id()));
      call_.detail = absl::StrCat("session=", session_->id());
    } else if (!c.session_id().empty() && c.session_id() != session_->id()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), " names session ", QuoteClientString(c.session_id()),
                       "; one SetParams stream uploads to one session (\"", session_->id(),
                       "\")"));
    }
    Upload* current = uploads_.empty() ? nullptr : &uploads_.back();
    if (!c.name().empty() && (current == nullptr || c.name() != current->name)) {
      KILN_ASSIGN_OR_RETURN(current, StartParam(c, current));
    } else if (current == nullptr) {
      if (c.data().empty() && c.offset() == 0) return absl::OkStatus();  // names the session only
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), " carries data but names no param: the first chunk of each ",
                       "param sets name, dtype and dims"));
    } else {
      const Dims dims(c.dims().begin(), c.dims().end());
      if ((c.dtype() != v1::DTYPE_UNSPECIFIED && c.dtype() != current->data.dtype()) ||
          (!dims.empty() && dims != current->data.dims())) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), " of param \"", current->name, "\" says ", DTypeName(c.dtype()),
            DimsToString(dims), "; its first chunk said ", DTypeName(current->data.dtype()),
            DimsToString(current->data.dims())));
      }
    }
    const int64_t total = current->data.num_bytes();
    if (c.offset() != current->received) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param \"", current->name, "\": ", Where(), " has offset ", c.offset(), ", expected ",
          current->received, " (a param's chunks come in order, without gaps or overlaps)"));
    }
    const int64_t len = static_cast<int64_t>(c.data().size());
    if (len > total - current->received) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param \"", current->name, "\": ", Where(), " covers bytes [", c.offset(), ", ",
          c.offset() + len, ") but the param has only ", total, " bytes (",
          DTypeName(current->data.dtype()), DimsToString(current->data.dims()), ")"));
    }
    if (len > 0) {
      std::memcpy(static_cast<char*>(current->data.data()) + current->received, c.data().data(),
                  len);
    }
    current->received += len;
    return absl::OkStatus();
  }

  absl::StatusOr<Upload*> StartParam(const v1::SetParamsChunk& c, const Upload* previous) {
    if (previous != nullptr && previous->received < previous->data.num_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "param \"", previous->name, "\" got ", previous->received, " of its ",
          previous->data.num_bytes(), " bytes before param ", QuoteClientString(c.name()), " started"));
    }
    if (!names_.insert(c.name()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("param ", QuoteClientString(c.name()), " is sent twice in one SetParams stream"));
    }
    const Dims dims(c.dims().begin(), c.dims().end());
    // A training session also takes its optimizer state (a restored
    // checkpoint), and with QAT's learned scales, those scales and their state.
    const bool lsq = session_->training() && session_->options().transforms.qat().lsq();
    if (session_->training() && train::IsOptimizerState(c.name())) {
      KILN_RETURN_IF_ERROR(
          CheckOptimizerStateAgainst(session_->signature(), c.name(), c.dtype(), dims, lsq));
    } else if (lsq && IsLsqScaleOf(session_->signature(), c.name())) {
      if (c.dtype() != v1::DTYPE_F32) {
        return absl::InvalidArgumentError(absl::StrCat("learned QAT scale ",
                                                       QuoteClientString(c.name()),
                                                       " must be f32, got ", DTypeName(c.dtype())));
      }
    } else {
      KILN_RETURN_IF_ERROR(CheckParamAgainst(session_->signature(), c.name(), c.dtype(), dims));
    }
    KILN_ASSIGN_OR_RETURN(
        int64_t bytes,
        CheckTensorHeader(c.dtype(), dims, service_.deps().config->limits(),
                          absl::StrCat("param ", QuoteClientString(c.name()))));
    // The quota is charged before the memory is allocated.
    KILN_RETURN_IF_ERROR(call_.tenant->AcquireBytes(bytes, bytes));
    reserved_ += bytes;
    // Uninitialized: the pages are committed as chunks are copied in, not all
    // at the first chunk (a stream that declares 1 GiB and sends 64 bytes
    // costs 64 bytes). Commit() binds only a param whose every byte arrived.
    KILN_ASSIGN_OR_RETURN(HostTensor data, HostTensor::CreateUninitialized(c.dtype(), dims));
    uploads_.push_back(Upload{c.name(), std::move(data), 0});
    return &uploads_.back();
  }

  absl::Status Commit() {
    if (ctx_->IsCancelled()) {
      return absl::CancelledError("the client cancelled the upload; nothing was applied");
    }
    if (!session_) {
      return absl::InvalidArgumentError(
          "empty SetParams stream: the first chunk must carry session_id");
    }
    if (!uploads_.empty()) {
      const Upload& last = uploads_.back();
      if (last.received < last.data.num_bytes()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "param \"", last.name, "\" got ", last.received, " of its ", last.data.num_bytes(),
            " bytes when the stream ended; nothing was applied"));
      }
    }
    std::vector<TensorRef> refs;
    int64_t bytes = 0;
    for (const Upload& u : uploads_) {
      refs.push_back(TensorRef::Of(u.name, u.data));
      bytes += u.data.num_bytes();
    }
    if (!refs.empty()) {
      KILN_RETURN_IF_ERROR(BindParams(*service_.deps().engine, *session_, refs));
      reserved_ = 0;  // now the session's charge
    }
    response_.set_params(static_cast<int32_t>(refs.size()));
    response_.set_bytes(bytes);
    absl::StrAppend(&call_.detail, " params=", refs.size(), " bytes=", bytes);
    return absl::OkStatus();
  }

  // Last use of `this` before OnDone may delete it.
  void Complete(absl::Status s) {
    if (s.ok()) s = SerializeMessage(response_, response_bytes_);
    service_.End(call_, s);
    Finish(ToGrpc(s));
  }

  KilnService& service_;
  grpc::CallbackServerContext* ctx_;
  grpc::ByteBuffer* response_bytes_;
  v1::SetParamsResponse response_;
  KilnService::Call call_;
  grpc::ByteBuffer bytes_;
  v1::SetParamsChunk chunk_;
  int64_t chunks_ = 0;
  std::shared_ptr<Session> session_;
  std::deque<Upload> uploads_;
  std::set<std::string> names_;
  int64_t reserved_ = 0;  // charged to the tenant, not yet the session's
};

// Streams the requested params in chunks, reading each from the device when
// its turn comes.
class GetParamsReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GetParamsReactor(KilnService& service, grpc::CallbackServerContext* ctx,
                   const grpc::ByteBuffer* request_bytes)
      : service_(service) {
    v1::GetParamsRequest request;
    absl::Status s =
        service_.Begin(ctx, "GetParams", static_cast<int64_t>(request_bytes->Length()), call_);
    if (s.ok()) {
      service_.deps().metrics->ObserveRequestBytes(call_.tenant->name(), "GetParams",
                                                   static_cast<int64_t>(request_bytes->Length()));
    }
    if (s.ok()) s = ParseMessage(*request_bytes, request, "the request");
    if (s.ok()) s = Start(request);
    if (!s.ok()) {
      Complete(s);
      return;
    }
    service_.deps().pool->Post([this] { Next(); });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Complete(absl::CancelledError("the client stopped reading the param stream"));
      return;
    }
    service_.deps().pool->Post([this] { Next(); });
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Start(const v1::GetParamsRequest& request) {
    KILN_ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                          service_.deps().sessions->Find(*call_.tenant, request.session_id()));
    call_.detail = absl::StrCat("session=", session->id());
    params_ = session->params();
    std::vector<std::string> bound = params_ ? params_->names() : std::vector<std::string>();
    if (request.names().empty()) {
      names_ = bound;
    } else {
      for (const std::string& n : request.names()) {
        if (std::find(bound.begin(), bound.end(), n) == bound.end()) {
          std::string list;
          for (const std::string& b : bound) absl::StrAppend(&list, list.empty() ? "" : ", ", b);
          return absl::NotFoundError(absl::StrCat("session has no param ", QuoteClientString(n), " bound; bound: ",
                                                  list.empty() ? "none" : list));
        }
        names_.push_back(n);
      }
    }
    if (request.chunk_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk_bytes is ", request.chunk_bytes(), "; must be >= 0 (0 = 1 MiB)"));
    }
    chunk_bytes_ = request.chunk_bytes() == 0 ? kDefaultChunkBytes
                                              : std::min(request.chunk_bytes(), kMaxChunkBytes);
    return absl::OkStatus();
  }

  void Next() {
    if (!current_ || current_done_) {
      if (next_name_ >= names_.size()) {
        Complete(absl::OkStatus());
        return;
      }
      auto t = params_->Read(names_[next_name_]);
      if (!t.ok()) {
        Complete(t.status());
        return;
      }
      current_ = std::make_unique<HostTensor>(std::move(t).value());
      name_ = names_[next_name_++];
      offset_ = 0;
      bytes_ += current_->num_bytes();
    }
    chunk_.Clear();
    chunk_.set_name(name_);
    chunk_.set_dtype(current_->dtype());
    for (int64_t dim : current_->dims()) chunk_.add_dims(dim);
    chunk_.set_offset(offset_);
    const int64_t len = std::min(chunk_bytes_, current_->num_bytes() - offset_);
    chunk_.set_data(static_cast<const char*>(current_->data()) + offset_, len);
    offset_ += len;
    current_done_ = offset_ >= current_->num_bytes();  // an empty param is one chunk
    out_.Clear();
    if (absl::Status s = SerializeMessage(chunk_, &out_); !s.ok()) {
      Complete(s);
      return;
    }
    StartWrite(&out_);
  }

  void Complete(const absl::Status& s) {
    if (s.ok()) absl::StrAppend(&call_.detail, " params=", names_.size(), " bytes=", bytes_);
    service_.End(call_, s);
    Finish(ToGrpc(s));
  }

  KilnService& service_;
  KilnService::Call call_;
  std::shared_ptr<ParamSet> params_;
  std::vector<std::string> names_;
  size_t next_name_ = 0;
  int64_t chunk_bytes_ = kDefaultChunkBytes;
  std::unique_ptr<HostTensor> current_;
  std::string name_;
  int64_t offset_ = 0;
  bool current_done_ = false;
  int64_t bytes_ = 0;
  v1::ParamChunk chunk_;
  grpc::ByteBuffer out_;
};

}  // namespace

absl::Status BindParams(Engine& engine, Session& session, std::span<const TensorRef> updates) {
  absl::MutexLock lock(&session.update_mu());
  const std::shared_ptr<ParamSet> current = session.params();
  std::map<std::string, int64_t> bytes = session.param_bytes();
  std::set<std::string> updated;
  for (const TensorRef& t : updates) updated.insert(t.name);
  std::vector<HostTensor> kept;
  std::vector<std::string> kept_names;
  if (current) {
    for (const std::string& name : current->names()) {
      if (updated.contains(name)) continue;
      KILN_ASSIGN_OR_RETURN(HostTensor t, current->Read(name));
      kept.push_back(std::move(t));
      kept_names.push_back(name);
    }
  }
  std::vector<TensorRef> all(updates.begin(), updates.end());
  for (size_t i = 0; i < kept.size(); ++i) all.push_back(TensorRef::Of(kept_names[i], kept[i]));
  // Copy on write: a session on a repository model shares the model's params
  // uncharged; the private copy it makes now is the tenant's.
  int64_t copied = 0;
  if (session.params_shared()) {
    for (const HostTensor& t : kept) copied += t.num_bytes();
    for (size_t i = 0; i < kept.size(); ++i) bytes[kept_names[i]] = kept[i].num_bytes();
    KILN_RETURN_IF_ERROR(session.owner().AcquireBytes(copied, copied))
        << "copying the model's params for this session's change";
  }
  absl::StatusOr<std::shared_ptr<ParamSet>> set = engine.CreateParams(all);
  if (!set.ok()) {
    session.owner().ReleaseBytes(copied, copied);
    return set.status();
  }
  int64_t replaced = 0;
  for (const TensorRef& t : updates) {
    if (auto it = bytes.find(t.name); it != bytes.end() && !session.params_shared()) replaced += it->second;
    bytes[t.name] = t.bytes;
  }
  if (absl::Status s = session.SetParams(*std::move(set), std::move(bytes)); !s.ok()) {
    session.owner().ReleaseBytes(copied, copied);
    return s;
  }
  session.owner().ReleaseBytes(replaced, replaced);
  return absl::OkStatus();
}

grpc::ServerReadReactor<grpc::ByteBuffer>* KilnService::SetParams(
    grpc::CallbackServerContext* ctx, grpc::ByteBuffer* response) {
  return new SetParamsReactor(*this, ctx, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* KilnService::GetParams(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  return new GetParamsReactor(*this, ctx, request);
}

}  // namespace kiln::server
