#include "clients/cpp/graph_builder.h"

namespace kiln {

GraphBuilder::GraphBuilder(std::string name) {
  graph_.set_name(std::move(name));
  graph_.set_ir_version(1);
}

v1::Node* GraphBuilder::Add(v1::OpKind op, const std::vector<Value>& operands) {
  v1::Node* n = graph_.add_nodes();
  n->set_id(graph_.nodes_size() - 1);
  n->set_op(op);
  for (const Value& v : operands) {
    v1::ValueRef* r = n->add_operands();
    r->set_node(v.node);
    r->set_output(v.output);
  }
  return n;
}

GraphBuilder::Value GraphBuilder::Last() const { return Value{graph_.nodes_size() - 1, 0}; }

GraphBuilder& GraphBuilder::named(const std::string& name) {
  if (graph_.nodes_size() > 0) graph_.mutable_nodes(graph_.nodes_size() - 1)->set_name(name);
  return *this;
}

GraphBuilder::Value GraphBuilder::input(const std::string& name, DType dtype,
                                        const std::vector<DimSpec>& dims) {
  v1::Node* n = Add(v1::OP_INPUT, {});
  n->set_name(name);
  n->mutable_attrs()->mutable_input();
  v1::TensorType* t = n->add_outputs();
  t->set_dtype(dtype);
  for (const DimSpec& d : dims) {
    if (const int64_t* size = std::get_if<int64_t>(&d)) {
      t->add_dims()->set_size(*size);
    } else {
      t->add_dims()->set_symbol(std::get<std::string>(d));
    }
  }
  return Last();
}

GraphBuilder::Value GraphBuilder::param(const std::string& name, DType dtype, const Dims& dims,
                                        bool frozen) {
  v1::Node* n = Add(v1::OP_PARAM, {});
  n->set_name(name);
  n->mutable_attrs()->mutable_param()->set_frozen(frozen);
  v1::TensorType* t = n->add_outputs();
  t->set_dtype(dtype);
  for (int64_t d : dims) t->add_dims()->set_size(d);
  return Last();
}

GraphBuilder::Value GraphBuilder::constant(const HostTensor& value, const std::string& name) {
  v1::Node* n = Add(v1::OP_CONSTANT, {});
  n->set_name(name);
  value.ToProto(n->mutable_attrs()->mutable_constant()->mutable_value());
  return Last();
}

GraphBuilder::Value GraphBuilder::scalar(double value, DType dtype) {
  auto t = HostTensor::Create(dtype, {});
  t->SetFromDouble(0, value);
  return constant(*t);
}

GraphBuilder::Value GraphBuilder::activation(v1::UnaryKind kind, Value x) {
  Add(v1::OP_UNARY, {x})->mutable_attrs()->mutable_unary()->set_kind(kind);
  return Last();
}

GraphBuilder::Value GraphBuilder::binary(v1::BinaryKind kind, Value a, Value b) {
  Add(v1::OP_BINARY, {a, b})->mutable_attrs()->mutable_binary()->set_kind(kind);
  return Last();
}

GraphBuilder::Value GraphBuilder::compare(v1::CompareKind kind, Value a, Value b) {
  Add(v1::OP_COMPARE, {a, b})->mutable_attrs()->mutable_compare()->set_kind(kind);
  return Last();
}

GraphBuilder::Value GraphBuilder::where(Value cond, Value a, Value b) {
  Add(v1::OP_WHERE, {cond, a, b})->mutable_attrs()->mutable_where();
  return Last();
}

GraphBuilder::Value GraphBuilder::cast(Value x, DType to) {
  Add(v1::OP_CAST, {x})->mutable_attrs()->mutable_cast()->set_to(to);
  return Last();
}

GraphBuilder::Value GraphBuilder::clamp(Value x, std::optional<double> min,
                                        std::optional<double> max) {
  auto* a = Add(v1::OP_CLAMP, {x})->mutable_attrs()->mutable_clamp();
  if (min) a->set_min(*min);
  if (max) a->set_max(*max);
  return Last();
}

GraphBuilder::Value GraphBuilder::matmul(Value a, Value b, bool transpose_a, bool transpose_b) {
  auto* m = Add(v1::OP_MATMUL, {a, b})->mutable_attrs()->mutable_matmul();
  m->set_transpose_a(transpose_a);
  m->set_transpose_b(transpose_b);
  return Last();
}

GraphBuilder::Value GraphBuilder::dot_general(Value a, Value b, const v1::DotGeneralAttrs& dims) {
  *Add(v1::OP_DOT_GENERAL, {a, b})->mutable_attrs()->mutable_dot_general() = dims;
  return Last();
}

GraphBuilder::Value GraphBuilder::softmax(Value x, int64_t axis) {
  Add(v1::OP_SOFTMAX, {x})->mutable_attrs()->mutable_softmax()->set_axis(axis);
  return Last();
}

GraphBuilder::Value GraphBuilder::log_softmax(Value x, int64_t axis) {
  Add(v1::OP_LOG_SOFTMAX, {x})->mutable_attrs()->mutable_log_softmax()->set_axis(axis);
  return Last();
}

GraphBuilder::Value GraphBuilder::layer_norm(Value x, std::optional<Value> scale,
                                             std::optional<Value> bias, double epsilon,
                                             int64_t axis) {
  std::vector<Value> ops = {x};
  if (scale) ops.push_back(*scale);
  if (bias) ops.push_back(*bias);
  auto* a = Add(v1::OP_LAYER_NORM, ops)->mutable_attrs()->mutable_layer_norm();
  a->set_epsilon(epsilon);
  a->set_axis(axis);
  return Last();
}

GraphBuilder::Value GraphBuilder::rms_norm(Value x, std::optional<Value> scale, double epsilon,
                                           int64_t axis) {
  std::vector<Value> ops = {x};
  if (scale) ops.push_back(*scale);
  auto* a = Add(v1::OP_RMS_NORM, ops)->mutable_attrs()->mutable_rms_norm();
  a->set_epsilon(epsilon);
  a->set_axis(axis);
  return Last();
}

GraphBuilder::Value GraphBuilder::rope(Value x, const v1::RopeAttrs& attrs,
                                       std::optional<Value> positions) {
  std::vector<Value> ops = {x};
  if (positions) ops.push_back(*positions);
  *Add(v1::OP_ROPE, ops)->mutable_attrs()->mutable_rope() = attrs;
  return Last();
}

GraphBuilder::Value GraphBuilder::attention(Value q, Value k, Value v,
                                            const v1::AttentionAttrs& attrs,
                                            std::optional<Value> mask) {
  std::vector<Value> ops = {q, k, v};
  if (mask) ops.push_back(*mask);
  *Add(v1::OP_ATTENTION, ops)->mutable_attrs()->mutable_attention() = attrs;
  return Last();
}

GraphBuilder::Value GraphBuilder::reshape(Value x, const std::vector<int64_t>& shape) {
  auto* a = Add(v1::OP_RESHAPE, {x})->mutable_attrs()->mutable_reshape();
  for (int64_t d : shape) a->add_shape(d);
  return Last();
}

GraphBuilder::Value GraphBuilder::transpose(Value x, const std::vector<int64_t>& perm) {
  auto* a = Add(v1::OP_TRANSPOSE, {x})->mutable_attrs()->mutable_transpose();
  for (int64_t p : perm) a->add_perm(p);
  return Last();
}

GraphBuilder::Value GraphBuilder::slice(Value x, const std::vector<int64_t>& start,
                                        const std::vector<int64_t>& stop,
                                        const std::vector<int64_t>& step,
                                        const std::vector<int64_t>& axes) {
  auto* a = Add(v1::OP_SLICE, {x})->mutable_attrs()->mutable_slice();
  for (int64_t v : start) a->add_start(v);
  for (int64_t v : stop) a->add_stop(v);
  for (int64_t v : step) a->add_step(v);
  for (int64_t v : axes) a->add_axes(v);
  return Last();
}

GraphBuilder::Value GraphBuilder::concat(const std::vector<Value>& xs, int64_t axis) {
  Add(v1::OP_CONCAT, xs)->mutable_attrs()->mutable_concat()->set_axis(axis);
  return Last();
}

GraphBuilder::Value GraphBuilder::expand(Value x, const std::vector<int64_t>& shape) {
  auto* a = Add(v1::OP_EXPAND, {x})->mutable_attrs()->mutable_expand();
  for (int64_t d : shape) a->add_shape(d);
  return Last();
}

GraphBuilder::Value GraphBuilder::pad(Value x, const std::vector<int64_t>& low,
                                      const std::vector<int64_t>& high, double value,
                                      v1::PadMode mode) {
  auto* a = Add(v1::OP_PAD, {x})->mutable_attrs()->mutable_pad();
  for (int64_t v : low) a->add_low(v);
  for (int64_t v : high) a->add_high(v);
  a->set_value(value);
  a->set_mode(mode);
  return Last();
}

GraphBuilder::Value GraphBuilder::gather(Value x, Value indices, int64_t axis) {
  Add(v1::OP_GATHER, {x, indices})->mutable_attrs()->mutable_gather()->set_axis(axis);
  return Last();
}

GraphBuilder::Value GraphBuilder::reduce(v1::ReduceKind kind, Value x,
                                         const std::vector<int64_t>& axes, bool keepdims) {
  auto* a = Add(v1::OP_REDUCE, {x})->mutable_attrs()->mutable_reduce();
  a->set_kind(kind);
  for (int64_t v : axes) a->add_axes(v);
  a->set_keepdims(keepdims);
  return Last();
}

GraphBuilder::Value GraphBuilder::argmax(Value x, int64_t axis, bool keepdims) {
  auto* a = Add(v1::OP_ARGMAX, {x})->mutable_attrs()->mutable_argmax();
  a->set_axis(axis);
  a->set_keepdims(keepdims);
  return Last();
}

GraphBuilder::Value GraphBuilder::cumsum(Value x, int64_t axis, bool exclusive, bool reverse) {
  auto* a = Add(v1::OP_CUMSUM, {x})->mutable_attrs()->mutable_cumsum();
  a->set_axis(axis);
  a->set_exclusive(exclusive);
  a->set_reverse(reverse);
  return Last();
}

GraphBuilder::Value GraphBuilder::conv(Value x, Value w, std::optional<Value> bias,
                                       const v1::ConvAttrs& attrs) {
  std::vector<Value> ops = {x, w};
  if (bias) ops.push_back(*bias);
  *Add(v1::OP_CONV, ops)->mutable_attrs()->mutable_conv() = attrs;
  return Last();
}

GraphBuilder::Value GraphBuilder::pool(Value x, const v1::PoolAttrs& attrs) {
  *Add(v1::OP_POOL, {x})->mutable_attrs()->mutable_pool() = attrs;
  return Last();
}

GraphBuilder::Value GraphBuilder::softmax_cross_entropy(Value logits, Value labels,
                                                        v1::Reduction reduction) {
  Add(v1::OP_SOFTMAX_CROSS_ENTROPY, {logits, labels})
      ->mutable_attrs()
      ->mutable_softmax_cross_entropy()
      ->set_reduction(reduction);
  return Last();
}

GraphBuilder::Value GraphBuilder::mean_squared_error(Value pred, Value target,
                                                     v1::Reduction reduction) {
  Add(v1::OP_MEAN_SQUARED_ERROR, {pred, target})
      ->mutable_attrs()
      ->mutable_mean_squared_error()
      ->set_reduction(reduction);
  return Last();
}

GraphBuilder::Value GraphBuilder::node(v1::OpKind op, const std::vector<Value>& operands,
                                       const v1::Attrs& attrs, const std::string& name) {
  v1::Node* n = Add(op, operands);
  *n->mutable_attrs() = attrs;
  n->set_name(name);
  return Last();
}

void GraphBuilder::output(const std::string& name, Value v) {
  v1::GraphOutput* o = graph_.add_outputs();
  o->set_name(name);
  o->mutable_value()->set_node(v.node);
  o->mutable_value()->set_output(v.output);
}

}  // namespace kiln
