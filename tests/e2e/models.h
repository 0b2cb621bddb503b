// Model graphs shared by the end-to-end tests and the benchmarks, with their
// parameters and plain f64 reference implementations.
#pragma once

#include <map>
#include <random>
#include <string>
#include <vector>

#include "base/host_tensor.h"
#include "engine/engine.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::models {

struct Model {
  v1::Graph graph;
  std::map<std::string, HostTensor> params;  // f32, by name
};

// 784-512-512-10 MLP with ReLU: input x f32[batch, 784], output "logits".
Model Mlp(uint64_t seed = 1, const std::vector<int64_t>& widths = {784, 512, 512, 10});
HostTensor MlpReference(const Model& m, const HostTensor& x);

struct EncoderConfig {
  int64_t seq = 128;
  int64_t hidden = 768;
  int64_t heads = 12;
  int64_t ffn = 3072;
  double epsilon = 1e-12;  // BERT's layer-norm epsilon
};

// A BERT-base encoder layer (post-LN): input x f32[batch, seq, hidden]
// (batch symbolic), output "y".
Model EncoderLayer(const EncoderConfig& config, uint64_t seed = 2);
HostTensor EncoderLayerReference(const Model& m, const EncoderConfig& config, const HostTensor& x);
// `layers` encoder layers in a row (BERT-base's encoder: 12), each with its own
// params named "l<i>_wq" and so on; input "x", output "y".
Model EncoderStack(const EncoderConfig& config, int layers, uint64_t seed = 2);

// Uniform random f32 tensor in [-scale, scale).
HostTensor RandomF32(std::mt19937_64& rng, const Dims& dims, double scale);

// y = tanh(... tanh(tanh(x @ w) @ w) ...), `depth` matmuls of n x n inputs x, w:
// a graph whose size and step count a test can dial.
v1::Graph MatMulChain(int64_t n, int depth);

// TensorRefs over a model's params, for Engine::CreateParams.
std::vector<TensorRef> ParamRefs(const Model& m);

// Largest |a - b| / (atol + rtol |b|) over all elements (<= 1 means within budget).
double WorstError(const HostTensor& got, const HostTensor& want, double atol, double rtol);

}  // namespace kiln::models
