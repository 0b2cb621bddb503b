// Small graphs the server tests share.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "base/host_tensor.h"
#include "kiln/v1/service.pb.h"
#include "tests/server/kilnd_process.h"

namespace kiln::testing {

// y = relu(x @ w + b): x f32[batch, 3], w f32[3, 2], b f32[2].
inline constexpr char kAffineText[] = R"(graph "affine"
input x: f32[batch, 3]
param w: f32[3, 2]
param b: f32[2]
let y = relu(x @ w + b)
out y
)";

// A graph that keeps the CPU busy: `matmuls` chained n x n matmuls of a
// matrix whose every entry is 1/n (a fixed point: the result stays 1/n),
// summed to a scalar. Input s: f32[1, 1] holds 1/n.
inline std::string SlowText(int n, int matmuls) {
  std::string t = absl::StrCat("graph \"slow\"\ninput s: f32[1, 1]\nlet a = expand(s, shape=[", n,
                               ", ", n, "])\nlet x0 = a @ a\n");
  for (int i = 1; i < matmuls; ++i) absl::StrAppend(&t, "let x", i, " = x", i - 1, " @ a\n");
  absl::StrAppend(&t, "let y = reduce_sum(x", matmuls - 1, ", axes=[0, 1])\nout y\n");
  return t;
}

inline v1::RunRequest SlowRequest(int n, int matmuls) {
  v1::RunRequest req;
  req.mutable_graph()->set_text(SlowText(n, matmuls));
  v1::NamedTensor* s = req.add_inputs();
  s->set_name("s");
  *s->mutable_tensor() =
      ToProto(HostTensor::FromVector(v1::DTYPE_F32, {1, 1}, std::vector<float>{1.0f / n}));
  return req;
}

inline void AddTensor(google::protobuf::RepeatedPtrField<v1::NamedTensor>* to,
                      const std::string& name, DType dtype, Dims dims,
                      const std::vector<double>& values) {
  v1::NamedTensor* t = to->Add();
  t->set_name(name);
  *t->mutable_tensor() = ToProto(HostTensor::FromVector(dtype, std::move(dims), values));
}

// A valid one-shot run of kAffineText with batch 2.
inline v1::RunRequest AffineRequest() {
  v1::RunRequest req;
  req.mutable_graph()->set_text(kAffineText);
  AddTensor(req.mutable_inputs(), "x", v1::DTYPE_F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  AddTensor(req.mutable_params(), "w", v1::DTYPE_F32, {3, 2}, {1, 0, 0, 1, 1, 1});
  AddTensor(req.mutable_params(), "b", v1::DTYPE_F32, {2}, {0.5, -0.5});
  return req;
}

}  // namespace kiln::testing
