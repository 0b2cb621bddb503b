// GraphBuilder: builds a wire graph (kiln.v1.Graph) op by op. The method
// names mirror the Python client's `kiln.Graph` (g.input, g.param, g.matmul,
// g.activation, ...) so a graph reads the same in both languages.
//
// The builder records; it does not verify. kilnd (or ImportGraph in-process)
// verifies the result and names the offending node on failure. Node ids are
// assigned in call order starting at 0. Not thread-safe.
#pragma once

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/host_tensor.h"
#include "kiln/v1/graph.pb.h"

namespace kiln {

class GraphBuilder {
 public:
  struct Value {
    int32_t node = -1;
    int32_t output = 0;
  };
  // A dim: a concrete size or a symbol ("batch", "?").
  using DimSpec = std::variant<int64_t, std::string>;

  explicit GraphBuilder(std::string name);

  // Sources.
  Value input(const std::string& name, DType dtype, const std::vector<DimSpec>& dims);
  Value param(const std::string& name, DType dtype, const Dims& dims, bool frozen = false);
  Value constant(const HostTensor& value, const std::string& name = "");
  Value scalar(double value, DType dtype = v1::DTYPE_F32);

  // Elementwise.
  Value activation(v1::UnaryKind kind, Value x);
  Value relu(Value x) { return activation(v1::UNARY_RELU, x); }
  Value gelu(Value x) { return activation(v1::UNARY_GELU, x); }
  Value silu(Value x) { return activation(v1::UNARY_SILU, x); }
  Value tanh(Value x) { return activation(v1::UNARY_TANH, x); }
  Value sigmoid(Value x) { return activation(v1::UNARY_SIGMOID, x); }
  Value exp(Value x) { return activation(v1::UNARY_EXP, x); }
  Value binary(v1::BinaryKind kind, Value a, Value b);
  Value add(Value a, Value b) { return binary(v1::BINARY_ADD, a, b); }
  Value sub(Value a, Value b) { return binary(v1::BINARY_SUB, a, b); }
  Value mul(Value a, Value b) { return binary(v1::BINARY_MUL, a, b); }
  Value div(Value a, Value b) { return binary(v1::BINARY_DIV, a, b); }
  Value compare(v1::CompareKind kind, Value a, Value b);
  Value where(Value cond, Value a, Value b);
  Value cast(Value x, DType to);
  Value clamp(Value x, std::optional<double> min, std::optional<double> max);

  // Linear algebra.
  Value matmul(Value a, Value b, bool transpose_a = false, bool transpose_b = false);
  Value dot_general(Value a, Value b, const v1::DotGeneralAttrs& dims);

  // Normalization and attention.
  Value softmax(Value x, int64_t axis = -1);
  Value log_softmax(Value x, int64_t axis = -1);
  Value layer_norm(Value x, std::optional<Value> scale, std::optional<Value> bias,
                   double epsilon = 1e-5, int64_t axis = -1);
  Value rms_norm(Value x, std::optional<Value> scale, double epsilon = 1e-6, int64_t axis = -1);
  Value rope(Value x, const v1::RopeAttrs& attrs = {}, std::optional<Value> positions = {});
  // q [B, Hq, Sq, D], k/v [B, Hkv, Sk, D]; `mask` is the custom mask or bias operand.
  Value attention(Value q, Value k, Value v, const v1::AttentionAttrs& attrs = {},
                  std::optional<Value> mask = {});

  // Shape.
  Value reshape(Value x, const std::vector<int64_t>& shape);
  Value transpose(Value x, const std::vector<int64_t>& perm);
  Value slice(Value x, const std::vector<int64_t>& start, const std::vector<int64_t>& stop,
              const std::vector<int64_t>& step = {}, const std::vector<int64_t>& axes = {});
  Value concat(const std::vector<Value>& xs, int64_t axis);
  Value expand(Value x, const std::vector<int64_t>& shape);
  Value pad(Value x, const std::vector<int64_t>& low, const std::vector<int64_t>& high,
            double value = 0.0, v1::PadMode mode = v1::PAD_CONSTANT);
  Value gather(Value x, Value indices, int64_t axis = 0);
  Value reduce(v1::ReduceKind kind, Value x, const std::vector<int64_t>& axes, bool keepdims = false);
  Value argmax(Value x, int64_t axis, bool keepdims = false);
  Value cumsum(Value x, int64_t axis, bool exclusive = false, bool reverse = false);

  // Vision.
  Value conv(Value x, Value w, std::optional<Value> bias, const v1::ConvAttrs& attrs = {});
  Value pool(Value x, const v1::PoolAttrs& attrs);

  // Losses.
  Value softmax_cross_entropy(Value logits, Value labels,
                              v1::Reduction reduction = v1::REDUCTION_MEAN);
  Value mean_squared_error(Value pred, Value target, v1::Reduction reduction = v1::REDUCTION_MEAN);

  // Any op: the escape hatch for ops without a helper. `attrs` must carry the
  // op's own attribute message (or none, for all defaults).
  Value node(v1::OpKind op, const std::vector<Value>& operands, const v1::Attrs& attrs,
             const std::string& name = "");
  // Names the most recently added node (debug name, shown in reports).
  GraphBuilder& named(const std::string& name);

  void output(const std::string& name, Value v);

  const v1::Graph& graph() const { return graph_; }
  v1::Graph Build() const { return graph_; }

 private:
  v1::Node* Add(v1::OpKind op, const std::vector<Value>& operands);
  Value Last() const;

  v1::Graph graph_;
};

}  // namespace kiln
