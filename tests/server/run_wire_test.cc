// Run's request and response on the wire (server/run_wire.h): the response
// serialized by hand is byte for byte what protobuf writes, large outputs
// are slices of the engine's buffers; a request's large tensors arrive in
// aligned memory outside the message; malformed bytes are refused. And
// through a real kilnd: a large input is read in place and a large output is
// not copied, by kiln_run_tensor_bytes_total.
#include "server/run_wire.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/server/kilnd_process.h"
#include "tests/server/test_graphs.h"

namespace kiln {
namespace {

using server::kWireTensorMinBytes;
using server::NamedHostTensors;
using server::ParseRunRequest;
using server::SerializeRunResponse;
using server::WireRunRequest;

HostTensor Iota(DType dtype, Dims dims) {
  HostTensor t = std::move(HostTensor::Create(dtype, std::move(dims))).value();
  for (int64_t i = 0; i < t.num_elements(); ++i) t.SetFromDouble(i, static_cast<double>(i % 1000) - 7);
  return t;
}

// `bytes` as a ByteBuffer of slices of at most `chunk` bytes (as gRPC hands
// over a message received in HTTP/2 frames).
grpc::ByteBuffer Chunked(const std::string& bytes, size_t chunk) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += chunk) {
    slices.emplace_back(bytes.data() + at, std::min(chunk, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& b, size_t* slices = nullptr) {
  std::vector<grpc::Slice> parts;
  EXPECT_TRUE(b.Dump(&parts).ok());
  std::string s;
  for (const grpc::Slice& p : parts) s.append(reinterpret_cast<const char*>(p.begin()), p.size());
  if (slices) *slices = parts.size();
  return s;
}

TEST(RunWire, ResponseIsProtobufsBytesWithLargeOutputsSliced) {
  auto outputs = std::make_shared<NamedHostTensors>();
  outputs->emplace_back("big", Iota(v1::DTYPE_F32, {3, 40000}));  // 480000 bytes
  outputs->emplace_back("small", Iota(v1::DTYPE_I64, {2, 3}));
  outputs->emplace_back("empty", Iota(v1::DTYPE_F32, {0, 5}));
  outputs->emplace_back("", Iota(v1::DTYPE_F16, {}));
  outputs->emplace_back("half", Iota(v1::DTYPE_BF16, {int64_t{1} << 15}));  // exactly 64 KiB
  v1::RunResponse head;
  head.set_request_id("req-17");
  head.mutable_report()->set_tenant("t");
  head.mutable_report()->set_run_micros(12.5);

  v1::RunResponse whole = head;
  for (const auto& [name, t] : *outputs) {
    v1::NamedTensor* nt = whole.add_outputs();
    nt->set_name(name);
    t.ToProto(nt->mutable_tensor());
  }
  const std::string expected = whole.SerializeAsString();

  grpc::ByteBuffer bytes;
  absl::StatusOr<server::WireOutputBytes> sent = SerializeRunResponse(head, outputs, &bytes);
  ASSERT_TRUE(sent.ok()) << sent.status();
  EXPECT_EQ(sent->sliced, 480000 + (int64_t{1} << 16));
  EXPECT_EQ(sent->copied, 2 * 3 * 8 + 2);
  size_t slices = 0;
  const std::string got = Flatten(bytes, &slices);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_TRUE(got == expected);
  // The two large outputs are slices of their own: the slice's bytes are the
  // tensor's memory, not a copy.
  std::vector<grpc::Slice> parts;
  ASSERT_TRUE(bytes.Dump(&parts).ok());
  int referenced = 0;
  for (const grpc::Slice& p : parts) {
    for (const auto& [name, t] : *outputs) {
      if (p.begin() == static_cast<const uint8_t*>(t.data())) ++referenced;
    }
  }
  EXPECT_EQ(referenced, 2);
  v1::RunResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(got));
  ASSERT_EQ(parsed.outputs_size(), 5);
  EXPECT_EQ(parsed.outputs(0).tensor().data(), std::string((*outputs)[0].second.bytes()));
  EXPECT_EQ(parsed.request_id(), "req-17");
  // The outputs outlive their holder while gRPC holds the slices.
  const void* big = (*outputs)[0].second.data();
  outputs.reset();
  EXPECT_EQ(std::memcmp(parts[1].begin(), big, 16), 0);
}

TEST(RunWire, EmptyResponseIsProtobufs) {
  v1::RunResponse head;
  grpc::ByteBuffer bytes;
  ASSERT_TRUE(SerializeRunResponse(head, std::make_shared<NamedHostTensors>(), &bytes).ok());
  EXPECT_EQ(bytes.Length(), 0u);
}

TEST(RunWire, LargeRequestTensorsArriveAlignedOutsideTheMessage) {
  v1::RunRequest req;
  req.set_session_id("s-1");
  req.set_priority(-3);
  req.set_report(true);
  const HostTensor big = Iota(v1::DTYPE_F32, {1, 100003});
  const HostTensor small = Iota(v1::DTYPE_I32, {4});
  const HostTensor param = Iota(v1::DTYPE_F64, {9000});
  v1::NamedTensor* a = req.add_inputs();
  a->set_name("small");
  small.ToProto(a->mutable_tensor());
  v1::NamedTensor* b = req.add_inputs();
  b->set_name("big");
  big.ToProto(b->mutable_tensor());
  v1::NamedTensor* p = req.add_params();
  p->set_name("w");
  param.ToProto(p->mutable_tensor());
  const std::string wire = req.SerializeAsString();
  // Chunk sizes that split the data at odd places.
  for (size_t chunk : {size_t{16384}, size_t{4097}, wire.size()}) {
    WireRunRequest got;
    ASSERT_TRUE(ParseRunRequest(Chunked(wire, chunk), got).ok());
    EXPECT_EQ(got.message.session_id(), "s-1");
    EXPECT_EQ(got.message.priority(), -3);
    EXPECT_TRUE(got.message.report());
    ASSERT_EQ(got.message.inputs_size(), 2);
    ASSERT_EQ(got.input_data.size(), 2u);
    EXPECT_EQ(got.message.inputs(0).tensor().data(), std::string(small.bytes()));
    EXPECT_EQ(got.input_data[0].data(), nullptr);
    EXPECT_EQ(got.message.inputs(1).name(), "big");
    EXPECT_TRUE(got.message.inputs(1).tensor().data().empty());
    EXPECT_EQ(got.message.inputs(1).tensor().dims_size(), 2);
    EXPECT_TRUE(got.input_data[1] == big.bytes());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got.input_data[1].data()) % 64, 0u);
    ASSERT_EQ(got.param_data.size(), 1u);
    EXPECT_TRUE(got.param_data[0] == param.bytes());
  }
}

TEST(RunWire, DataBeforeItsHeaderAndTwiceKeepsTheLast) {
  // Not protobuf's order, but valid protobuf: data, then dims and dtype; and
  // a second data field, which replaces the first.
  const std::string first(70000, 'a'), second(70000, 'b');
  std::string tensor;
  auto put = [](std::string& s, uint64_t v) {
    while (v >= 0x80) {
      s.push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    s.push_back(static_cast<char>(v));
  };
  put(tensor, 0x1A);
  put(tensor, first.size());
  tensor += first;
  put(tensor, 0x10);  // dims, unpacked
  put(tensor, 70000);
  put(tensor, 0x08);  // dtype u8
  put(tensor, v1::DTYPE_U8);
  put(tensor, 0x1A);
  put(tensor, second.size());
  tensor += second;
  std::string named;
  put(named, 0x12);
  put(named, tensor.size());
  named += tensor;
  put(named, 0x0A);
  named += '\x01';
  named += 'x';
  std::string wire;
  put(wire, 0x22);  // inputs
  put(wire, named.size());
  wire += named;
  v1::RunRequest reference;
  ASSERT_TRUE(reference.ParseFromString(wire));
  WireRunRequest got;
  ASSERT_TRUE(ParseRunRequest(Chunked(wire, 1000), got).ok());
  ASSERT_EQ(got.message.inputs_size(), 1);
  EXPECT_EQ(got.message.inputs(0).name(), "x");
  EXPECT_EQ(got.message.inputs(0).tensor().dtype(), v1::DTYPE_U8);
  EXPECT_EQ(got.message.inputs(0).tensor().dims_size(), 1);
  EXPECT_TRUE(got.input_data[0] == std::string_view(reference.inputs(0).tensor().data()));
  EXPECT_TRUE(got.input_data[0] == std::string_view(second));
}

TEST(RunWire, MalformedRequestsAreRefused) {
  v1::RunRequest req;
  req.set_session_id("s");
  const HostTensor big = Iota(v1::DTYPE_F32, {50000});
  v1::NamedTensor* a = req.add_inputs();
  a->set_name("x");
  big.ToProto(a->mutable_tensor());
  const std::string wire = req.SerializeAsString();
  // Cut anywhere inside the tensor: never a crash, always INVALID_ARGUMENT.
  for (size_t cut : {size_t{5}, size_t{20}, wire.size() / 2, wire.size() - 1}) {
    WireRunRequest got;
    absl::Status s = ParseRunRequest(Chunked(wire.substr(0, cut), 8192), got);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << cut;
    EXPECT_NE(s.message().find("RunRequest"), std::string::npos) << s;
  }
  // A length claiming 2 GiB in a short message: refused before any allocation.
  std::string lie = "\x22\xff\xff\xff\xff\x07" + std::string(100, '\0');
  WireRunRequest got;
  EXPECT_EQ(ParseRunRequest(Chunked(lie, 64), got).code(), absl::StatusCode::kInvalidArgument);
  // A tag of field 0.
  WireRunRequest zero;
  EXPECT_EQ(ParseRunRequest(Chunked(std::string("\x00\x01", 2), 64), zero).code(),
            absl::StatusCode::kInvalidArgument);
}

// Through kilnd: counted by path.
class ServerWire : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    kilnd_ = testing::KilndProcess::Start({.cache_dir = cache_.path()}, &error);
    ASSERT_NE(kilnd_, nullptr) << error;
    stub_ = kilnd_->Stub();
  }
  void TearDown() override {
    if (HasFailure()) std::cerr << "kilnd log:\n" << kilnd_->Log();
  }
  double Bytes(const std::string& direction, const std::string& path) {
    return testing::MetricValue(testing::HttpGet(kilnd_->metrics_port(), "/metrics"),
                                "kiln_run_tensor_bytes_total",
                                {{"tenant", "default"}, {"direction", direction}, {"path", path}});
  }
  v1::RunRequest Doubling(int64_t n) {
    v1::RunRequest req;
    req.mutable_graph()->set_text("graph \"twice\"\ninput x: f32[n]\nlet y = x + x\nout y\n");
    req.mutable_options()->set_device("cpu:0");  // host memory: inputs can be read in place
    v1::NamedTensor* x = req.add_inputs();
    x->set_name("x");
    Iota(v1::DTYPE_F32, {n}).ToProto(x->mutable_tensor());
    return req;
  }

  testing::TempDir cache_;
  std::unique_ptr<testing::KilndProcess> kilnd_;
  std::unique_ptr<v1::Kiln::Stub> stub_;
};

TEST_F(ServerWire, LargeInputReadInPlaceLargeOutputNotCopied) {
  constexpr int64_t n = int64_t{1} << 20;  // 4 MiB each way
  const v1::RunRequest req = Doubling(n);
  v1::RunResponse warm;  // compiles
  ASSERT_TRUE(stub_->Run(testing::Context().get(), req, &warm).ok());
  const double in_place = Bytes("input", "in_place"), in_copied = Bytes("input", "copied");
  const double sliced = Bytes("output", "sliced"), out_copied = Bytes("output", "copied");
  v1::RunResponse resp;
  grpc::Status s = stub_->Run(testing::Context().get(), req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(resp.outputs_size(), 1);
  const HostTensor y = testing::FromProto(resp.outputs(0).tensor());
  ASSERT_EQ(y.num_elements(), n);
  const HostTensor x = testing::FromProto(req.inputs(0).tensor());
  for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(y.GetAsDouble(i), 2 * x.GetAsDouble(i)) << i;
  EXPECT_EQ(Bytes("input", "in_place") - in_place, 4 * n);
  EXPECT_EQ(Bytes("input", "copied") - in_copied, 0);
  EXPECT_EQ(Bytes("output", "sliced") - sliced, 4 * n);
  EXPECT_EQ(Bytes("output", "copied") - out_copied, 0);
  // The 4 MiB output's buffer is kept for the next run once the response is
  // sent, and /metrics shows it (resident memory in no quota) and the bound.
  // Where a CUDA device worker serves cuda:0, large HostTensors come from the
  // host arena it maps instead (base/host_arena.h, docs/cuda.md), not the pool.
  double kept = 0, limit = 0;
  bool arena = false;
  for (int i = 0; i < 50 && kept < 4.0 * n && !arena; ++i) {
    const std::string m = testing::HttpGet(kilnd_->metrics_port(), "/metrics");
    kept = testing::MetricValue(m, "kiln_host_buffer_pool_bytes");
    limit = testing::MetricValue(m, "kiln_host_buffer_pool_limit_bytes");
    arena = testing::MetricValue(m, "kiln_host_arena_bytes") > 0;
    if (kept < 4.0 * n && !arena) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!arena) {
    EXPECT_GE(kept, 4.0 * n);
  }
  EXPECT_LE(kept, limit);
  EXPECT_EQ(limit, double{1 << 30});
}

TEST_F(ServerWire, SmallOutputIsCopiedIntoTheMessage) {
  const v1::RunRequest req = Doubling(16);
  const double out_copied = Bytes("output", "copied");
  v1::RunResponse resp;
  ASSERT_TRUE(stub_->Run(testing::Context().get(), req, &resp).ok());
  ASSERT_EQ(resp.outputs_size(), 1);
  EXPECT_EQ(testing::FromProto(resp.outputs(0).tensor()).GetAsDouble(3), 2 * (3 - 7));
  EXPECT_EQ(Bytes("output", "copied") - out_copied, 64);
}

TEST_F(ServerWire, TruncatedLargeRequestIsInvalidArgument) {
  const std::string wire = Doubling(int64_t{1} << 16).SerializeAsString();
  std::string out;
  grpc::Status s = testing::RawUnaryCall(*kilnd_->channel(), "/kiln.v1.Kiln/Run",
                                         wire.substr(0, wire.size() - 100), &out);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  v1::RunResponse resp;  // and kilnd goes on
  EXPECT_TRUE(stub_->Run(testing::Context().get(), Doubling(8), &resp).ok());
}

}  // namespace
}  // namespace kiln
