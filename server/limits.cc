#include "server/limits.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "engine/ir/text.h"
#include "server/config.h"

namespace kiln::server {
namespace {

struct GraphWalk {
  const v1::Limits& limits;
  int64_t nodes = 0;

  absl::Status Visit(const v1::Graph& g, int depth, const std::string& where) {
    if (depth > limits.max_subgraph_depth()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          where, " nests subgraphs ", depth, " deep, over the limit limits.max_subgraph_depth = ",
          limits.max_subgraph_depth()));
    }
    nodes += g.nodes_size();
    if (nodes > limits.max_nodes()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "graph ", QuoteClientString(g.name()), " has more than ", limits.max_nodes(),
          " nodes (subgraphs included), over the limit limits.max_nodes = ", limits.max_nodes()));
    }
    for (const v1::Node& n : g.nodes()) {
      const std::string label = absl::StrCat(where, " node ", n.id(), n.name().empty() ? "" : " \"",
                                             n.name(), n.name().empty() ? "" : "\"");
      const v1::Attrs& a = n.attrs();
      if (a.has_constant()) {
        auto bytes = CheckTensor(a.constant().value(), limits, absl::StrCat(label, " constant"));
        if (!bytes.ok()) return bytes.status();
      }
      if (a.has_scan()) {
        if (auto s = Visit(a.scan().body(), depth + 1, absl::StrCat(label, " scan body")); !s.ok()) {
          return s;
        }
      }
      if (a.has_if_()) {
        for (const v1::Graph* b : {&a.if_().then_branch(), &a.if_().else_branch()}) {
          if (auto s = Visit(*b, depth + 1, absl::StrCat(label, " if branch")); !s.ok()) return s;
        }
      }
      if (a.has_while_()) {
        for (const v1::Graph* b : {&a.while_().cond(), &a.while_().body()}) {
          if (auto s = Visit(*b, depth + 1, absl::StrCat(label, " while subgraph")); !s.ok()) {
            return s;
          }
        }
      }
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::string TypeString(const v1::TensorType& type) {
  std::string s = absl::StrCat(DTypeName(type.dtype()), "[");
  for (int i = 0; i < type.dims_size(); ++i) {
    const v1::Dim& d = type.dims(i);
    absl::StrAppend(&s, i ? ", " : "", d.has_size() ? absl::StrCat(d.size()) : d.symbol());
  }
  return s + "]";
}

absl::StatusOr<int64_t> CheckTensorHeader(DType dtype, std::span<const int64_t> dims,
                                          const v1::Limits& limits, const std::string& what) {
  if (dtype == v1::DTYPE_UNSPECIFIED || !IsKnownDType(dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dtype ", DTypeName(dtype), " is not a valid element type"));
  }
  if (static_cast<int64_t>(dims.size()) > limits.max_rank()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": rank ", dims.size(),
                                                   " is over the limit limits.max_rank = ",
                                                   limits.max_rank()));
  }
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": dim ", i, " is ", dims[i], "; dims must be >= 0"));
    }
  }
  auto n = CheckedNumElements(dims);
  if (!n.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(what, ": ", n.status().message()));
  }
  if (*n > limits.max_tensor_elements()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": ", DTypeName(dtype), DimsToString(dims), " has ", *n,
        " elements, over the limit limits.max_tensor_elements = ", limits.max_tensor_elements()));
  }
  const std::optional<int64_t> bytes = BytesFor(dtype, *n);
  if (!bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", *n, " elements are not a whole ",
                                                   "number of ", DTypeName(dtype), " blocks"));
  }
  if (*bytes > limits.max_tensor_bytes()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": ", DTypeName(dtype), DimsToString(dims), " has ", *bytes,
        " bytes, over the limit limits.max_tensor_bytes = ", limits.max_tensor_bytes()));
  }
  return *bytes;
}

namespace {

// CheckTensor with the data's length given (it may have arrived outside the message).
absl::StatusOr<int64_t> CheckTensorWithData(const v1::Tensor& tensor, size_t data_bytes,
                                            const v1::Limits& limits, const std::string& what) {
  auto bytes = CheckTensorHeader(tensor.dtype(),
                                 std::span<const int64_t>(tensor.dims().data(), tensor.dims_size()),
                                 limits, what);
  if (!bytes.ok()) return bytes.status();
  if (static_cast<int64_t>(data_bytes) != *bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", DTypeName(tensor.dtype()),
        DimsToString(std::span<const int64_t>(tensor.dims().data(), tensor.dims_size())),
        " needs ", *bytes, " bytes of data, got ", data_bytes));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<int64_t> CheckTensor(const v1::Tensor& tensor, const v1::Limits& limits,
                                    const std::string& what) {
  return CheckTensorWithData(tensor, tensor.data().size(), limits, what);
}

absl::StatusOr<std::vector<TensorRef>> CheckNamedTensors(
    const google::protobuf::RepeatedPtrField<v1::NamedTensor>& tensors, const v1::Limits& limits,
    const std::string& kind, std::span<const std::string_view> moved, bool allow_shm) {
  if (!moved.empty() && moved.size() != static_cast<size_t>(tensors.size())) {
    return absl::InternalError(absl::StrCat(kind, "s: ", moved.size(), " moved data entries for ",
                                            tensors.size(), " tensors"));
  }
  std::vector<TensorRef> refs;
  refs.reserve(tensors.size());
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < tensors.size(); ++i) {
    const v1::NamedTensor& nt = tensors[i];
    if (nt.name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(kind, "s[", i, "] has no name"));
    }
    if (!seen.insert(nt.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat(kind, " ", QuoteClientString(nt.name()), " is given twice"));
    }
    const std::string what = absl::StrCat(kind, " ", QuoteClientString(nt.name()));
    if (!nt.has_tensor()) return absl::InvalidArgumentError(absl::StrCat(what, " has no tensor"));
    if (nt.has_shm()) {
      if (!allow_shm) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " names shared memory: only Run's inputs (and TrainStep's batch) may; send the bytes in tensor.data"));
      }
      const v1::Tensor& t = nt.tensor();
      KILN_ASSIGN_OR_RETURN(
          int64_t bytes,
          CheckTensorHeader(t.dtype(), std::span<const int64_t>(t.dims().data(), t.dims_size()),
                            limits, what));
      const size_t data_bytes =
          !moved.empty() && moved[i].data() != nullptr ? moved[i].size() : t.data().size();
      if (data_bytes != 0 || nt.shm().bytes() != bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " is ", bytes, " bytes; in shared memory its tensor.data must be empty and ",
            "shm.bytes ", bytes, " (got ", data_bytes, " and ", nt.shm().bytes(), ")"));
      }
      refs.push_back(TensorRef{nt.name(), t.dtype(), Dims(t.dims().begin(), t.dims().end()),
                               nullptr, bytes});
      continue;
    }
    const v1::Tensor& t = nt.tensor();
    const std::string_view data =
        !moved.empty() && moved[i].data() != nullptr ? moved[i] : std::string_view(t.data());
    auto bytes = CheckTensorWithData(t, data.size(), limits, what);
    if (!bytes.ok()) return bytes.status();
    refs.push_back(TensorRef{nt.name(), t.dtype(), Dims(t.dims().begin(), t.dims().end()),
                             data.data(), *bytes});
  }
  return refs;
}

absl::Status CheckGraph(const v1::Graph& graph, const v1::Limits& limits) {
  GraphWalk walk{limits};
  return walk.Visit(graph, 0, absl::StrCat("graph ", QuoteClientString(graph.name())));
}

absl::StatusOr<v1::Graph> ResolveGraph(const v1::GraphSource& source, const v1::Limits& limits) {
  switch (source.kind_case()) {
    case v1::GraphSource::kGraph: {
      if (auto s = CheckGraph(source.graph(), limits); !s.ok()) return s;
      return source.graph();
    }
    case v1::GraphSource::kText: {
      ir::ParseOptions options;
      const ir::VerifyOptions verify = VerifyOptionsFrom(limits);
      options.limits = verify.limits;
      options.max_nodes = verify.max_nodes;
      auto g = ir::ParseGraphProto(source.text(), options);
      if (!g.ok()) {
        return absl::Status(g.status().code(),
                            absl::StrCat("graph text: ", g.status().message()));
      }
      return std::move(g).value();
    }
    default:
      return absl::InvalidArgumentError(
          "no graph: set graph.graph (a kiln.v1.Graph) or graph.text (.kiln text)");
  }
}

}  // namespace kiln::server
