// The hand-built ONNX models of the importer tests (onnx_import_test.cc,
// onnx_rnn_test.cc): a small ModelProto builder, the import and a CPU engine.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/io/onnx/onnx_import.h"
#include "onnx/onnx_pb.h"

namespace kiln::onnx_test {

// A small ONNX model builder.
struct Model {
  onnx::ModelProto m;
  explicit Model(int opset) {
    m.set_ir_version(8);
    auto* o = m.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    m.mutable_graph()->set_name("test");
  }
  onnx::GraphProto& g() { return *m.mutable_graph(); }
  // dims: >= 0 sizes; -1 a dim_param "batch"; -2 no dim at all.
  void Input(const std::string& name, std::vector<int64_t> dims,
             int type = onnx::TensorProto::FLOAT) {
    auto* vi = g().add_input();
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    auto* shape = tt->mutable_shape();
    for (int64_t d : dims) {
      auto* dim = shape->add_dim();
      if (d >= 0) dim->set_dim_value(d);
      if (d == -1) dim->set_dim_param("batch");
    }
  }
  void Output(const std::string& name) { g().add_output()->set_name(name); }
  onnx::TensorProto* Init(const std::string& name, std::vector<int64_t> dims,
                          std::vector<float> values) {
    auto* t = g().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    for (float v : values) t->add_float_data(v);
    return t;
  }
  void InitInts(const std::string& name, std::vector<int64_t> values) {
    auto* t = g().add_initializer();
    t->set_name(name);
    t->set_data_type(onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(values.size()));
    for (int64_t v : values) t->add_int64_data(v);
  }
  onnx::NodeProto* Node(const std::string& op, std::vector<std::string> in,
                        std::vector<std::string> out, const std::string& name = "") {
    auto* n = g().add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? out[0] : name);
    for (auto& s : in) n->add_input(s);
    for (auto& s : out) n->add_output(s);
    return n;
  }
  static void Ints(onnx::NodeProto* n, const std::string& name, std::vector<int64_t> v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t x : v) a->add_ints(x);
  }
  static void Float(onnx::NodeProto* n, const std::string& name, float v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(v);
  }
  std::string Bytes() const { return m.SerializeAsString(); }
};

// A node and a typed input of a subgraph (an If branch, a Loop or Scan body).
inline onnx::NodeProto* SubNode(onnx::GraphProto& g, const std::string& op,
                                std::vector<std::string> in, std::vector<std::string> out) {
  auto* n = g.add_node();
  n->set_op_type(op);
  n->set_name(out[0]);
  for (auto& s : in) n->add_input(s);
  for (auto& s : out) n->add_output(s);
  return n;
}

inline void SubInput(onnx::GraphProto& g, const std::string& name, int type) {
  auto* vi = g.add_input();
  vi->set_name(name);
  vi->mutable_type()->mutable_tensor_type()->set_elem_type(type);
}

inline absl::StatusOr<io::OnnxModel> Import(const Model& m, const io::OnnxImportOptions& o = {}) {
  return io::ImportOnnxModel(m.Bytes(), o);
}

inline std::unique_ptr<Engine> MakeEngine() {
  EngineOptions o;
  o.calibration = EngineOptions::Calibration::kNever;
  o.disabled_backends = {"vulkan", "cuda"};
  return std::move(Engine::Create(o)).value();
}

}  // namespace kiln::onnx_test
