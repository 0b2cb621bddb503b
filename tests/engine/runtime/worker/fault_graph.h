// A graph around the test-only fault kernel (fault_worker.cc): y = fault(x * 2)
// for x f32[64], where launching the fault node does what `mode` says
// ("pass" copies; "crash", "exit", "hang", "lost", "error" fail).
#pragma once

#include <string>

#include "clients/cpp/graph_builder.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::testing {

inline v1::Graph FaultGraph(const std::string& mode) {
  GraphBuilder b("fault_" + mode);
  auto x = b.input("x", v1::DTYPE_F32, {64});
  auto twice = b.mul(x, b.scalar(2.0));
  v1::Attrs attrs;
  attrs.mutable_custom()->set_name("kiln.test.fault");
  attrs.mutable_custom()->set_payload(mode);
  auto f = b.node(v1::OP_CUSTOM, {twice}, attrs, "fault");
  v1::Graph g = b.Build();
  // Custom ops declare their result types.
  v1::TensorType* t = g.mutable_nodes(g.nodes_size() - 1)->add_outputs();
  t->set_dtype(v1::DTYPE_F32);
  t->add_dims()->set_size(64);
  v1::GraphOutput* out = g.add_outputs();
  out->set_name("y");
  out->mutable_value()->set_node(f.node);
  return g;
}

}  // namespace kiln::testing
