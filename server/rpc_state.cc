// Stateful sessions (CreateSessionRequest.state): a bound output's value
// becomes its param's value for the next run, written in place on the device
// by the executable's param updates (the mechanism of a training step, LIR
// param_updates), after the run's last kernel. Like Triton's implicit
// sequence state; a KV cache is the use it was built for.
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "server/client_string.h"
#include "server/limits.h"
#include "server/rpc_common.h"

namespace kiln::server {
namespace {

bool Fixed(const v1::TensorType& t) {
  for (const v1::Dim& d : t.dims()) {
    if (!d.has_size()) return false;
  }
  return true;
}

const GraphSignature::Entry* FindEntry(const std::vector<GraphSignature::Entry>& entries,
                                       const std::string& name) {
  for (const auto& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

}  // namespace

absl::Status ApplyStateBindings(const google::protobuf::RepeatedPtrField<v1::StateBinding>& state,
                                GraphSignature& signature, CompileOptions& options) {
  if (state.empty()) return absl::OkStatus();
  if (options.transforms.has_training()) {
    return absl::InvalidArgumentError(
        "state bindings are for inference sessions: a training session updates its params "
        "through its optimizer");
  }
  std::set<std::string> outputs, params;
  for (int i = 0; i < state.size(); ++i) {
    const v1::StateBinding& b = state[i];
    const std::string where = absl::StrCat("state[", i, "] (output ", QuoteClientString(b.output()),
                                           " -> param ", QuoteClientString(b.param()), ")");
    if (b.output().empty() || b.param().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": name both an output and a param"));
    }
    const GraphSignature::Entry* out = FindEntry(signature.outputs, b.output());
    if (out == nullptr) {
      std::string names;
      for (const auto& e : signature.outputs)
        absl::StrAppend(&names, names.empty() ? "" : ", ", e.name);
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the graph has no output by that name (its outputs: ", names, ")"));
    }
    const GraphSignature::Entry* param = FindEntry(signature.params, b.param());
    if (param == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, FindEntry(signature.inputs, b.param()) != nullptr
                                  ? ": that is an input; state is kept in a param"
                                  : ": the graph has no param by that name"));
    }
    if (!params.insert(b.param()).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the param is bound twice"));
    }
    if (!outputs.insert(b.output()).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": the output is bound twice"));
    }
    if (out->type.dtype() != param->type.dtype()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the output is ", TypeString(out->type), " but the param is ",
                       TypeString(param->type), ": the dtypes differ"));
    }
    if (!Fixed(out->type) || !Fixed(param->type)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": the output is ", TypeString(out->type), " and the param ",
          TypeString(param->type), ": a state needs a fixed shape (no symbolic dims)"));
    }
    bool same = out->type.dims_size() == param->type.dims_size();
    for (int d = 0; same && d < out->type.dims_size(); ++d) {
      same = out->type.dims(d).size() == param->type.dims(d).size();
    }
    if (!same) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the output is ", TypeString(out->type), " but the param is ",
                       TypeString(param->type), ": the shapes differ"));
    }
    options.state_updates.emplace_back(b.output(), b.param());
  }
  std::erase_if(signature.outputs,
                [&](const GraphSignature::Entry& e) { return outputs.contains(e.name); });
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ParamSet>> StateParams(Engine& engine, Session& session,
                                                            const Executable& executable) {
  absl::MutexLock lock(&session.update_mu());
  std::shared_ptr<ParamSet> current = session.params();
  if (current && current->training()) return current;
  std::vector<HostTensor> values;
  std::vector<TensorRef> refs;
  KILN_RETURN_IF_ERROR(ReadAllParams(current.get(), values, refs));
  absl::StatusOr<std::shared_ptr<ParamSet>> set = engine.CreateStateParams(executable, refs);
  if (!set.ok()) {
    return StatusBuilder(set.status())
           << "bind the session's params (its state too) with CreateSession or SetParams";
  }
  // A session on a repository model shared the model's params uncharged; the
  // state set is its own copy, and the tenant's.
  std::map<std::string, int64_t> bytes = session.param_bytes();
  int64_t copied = 0;
  if (session.params_shared()) {
    for (const HostTensor& t : values) copied += t.num_bytes();
    for (size_t i = 0; i < values.size(); ++i) bytes[refs[i].name] = values[i].num_bytes();
    KILN_RETURN_IF_ERROR(session.owner().AcquireBytes(copied, copied))
        << "copying the model's params for this stateful session";
  }
  if (absl::Status s = session.SetParams(*set, std::move(bytes)); !s.ok()) {
    session.owner().ReleaseBytes(copied, copied);
    return s;
  }
  return std::shared_ptr<const ParamSet>(*std::move(set));
}

}  // namespace kiln::server
