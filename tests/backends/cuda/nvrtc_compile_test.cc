// Compiles every CUDA kernel source the backend can produce with NVRTC for
// sm_90 (the H200), with no GPU: the embedded hand-written families and the
// generated elementwise kernels over every op kind and dtype they serve.
// NVRTC runs without a driver, so this catches kernel bugs on any machine
// with the toolkit; skipped only where libnvrtc itself is missing.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "backends/backend.h"
#include "backends/common/elementwise_region.h"
#include "backends/cuda/attention_plan.h"
#include "backends/cuda/codegen_elementwise.h"
#include "backends/cuda/cuda_api.h"
#include "backends/cuda/cuda_kernel.h"
#include "backends/cuda/dequant_plan.h"
#include "backends/cuda/nvrtc_compiler.h"

namespace kiln::cuda {
namespace {

using backend::KernelSpec;

constexpr char kArch[] = "sm_90";

// The cache key is the first NVRTC call a prepare makes (ModuleCache::Get):
// it must load NVRTC itself (it called through a null pointer on the GPU
// machine, where no compile had run before). Runs before the other cases.
TEST(NvrtcCacheKey, LoadsNvrtcItself) {
  const std::string key = CubinCacheKey("extern \"C\" __global__ void f() {}", "sm_90");
  EXPECT_EQ(key.rfind("cuda-cubin-", 0), 0u);
}

class NvrtcCompileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status s = LoadNvrtc(); !s.ok()) GTEST_SKIP() << s;
  }

  // Generates and compiles the kernel of `spec`; checks it is claimed.
  void CompileElementwise(const KernelSpec& spec) {
    SCOPED_TRACE(spec.name);
    absl::StatusOr<backend::ElementwiseRegion> region = backend::DecodeSpec(spec);
    ASSERT_TRUE(region.ok()) << region.status();
    ASSERT_EQ(ElementwiseUnsupported(spec, *region), "");
    const std::string source = GenerateElementwise(spec, *region);
    absl::StatusOr<std::string> cubin = CompileCubin(spec.name, source, kArch);
    ASSERT_TRUE(cubin.ok()) << cubin.status() << "\n" << source;
    EXPECT_EQ(cubin->compare(0, 4,
                             "\x7f"
                             "ELF"),
              0);
  }
};

// One NVRTC compile of each embedded family per process, shared by the two
// tests that read them (each family took ~3 s to compile, twice: ~42 s of the
// suite's CPU time on the 2-core VM).
const absl::StatusOr<std::string>& FamilyCubin(const std::string& name) {
  static auto* cubins = new std::map<std::string, absl::StatusOr<std::string>>();
  auto it = cubins->find(name);
  if (it == cubins->end()) it = cubins->emplace(name, CompileCubin(name, KernelSource(name), kArch)).first;
  return it->second;
}

KernelSpec Elementwise(v1::OpKind op, std::vector<backend::TensorDesc> in, backend::TensorDesc out,
                       std::string name) {
  KernelSpec s;
  s.name = s.label = std::move(name);
  s.op = op;
  s.inputs = std::move(in);
  s.outputs = {std::move(out)};
  return s;
}

const DType kFloats[] = {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16};
const DType kInts[] = {v1::DTYPE_I32, v1::DTYPE_I64, v1::DTYPE_I8};
const DType kAll[] = {v1::DTYPE_F32, v1::DTYPE_F16, v1::DTYPE_BF16, v1::DTYPE_I8,  v1::DTYPE_U8,
                      v1::DTYPE_I16, v1::DTYPE_I32, v1::DTYPE_I64,  v1::DTYPE_BOOL};

TEST_F(NvrtcCompileTest, EmbeddedFamilies) {
  const std::vector<std::string> names = EmbeddedSourceNames();
  ASSERT_FALSE(names.empty());
  int compiled = 0;
  for (const std::string& name : names) {
    if (name.ends_with(".cuh")) continue;  // headers: compiled as part of every family
    const absl::StatusOr<std::string>& cubin = FamilyCubin(name);
    EXPECT_TRUE(cubin.ok()) << name << ": " << cubin.status();
    ++compiled;
  }
  EXPECT_GE(compiled, 4);
}

// Every entry point the kernel families look up (cuModuleGetFunction by
// name) is in its family's cubin: the names are built from dtype names in
// the .cc files and from macros in the .cu files, and must agree.
TEST_F(NvrtcCompileTest, EveryEntryPointTheFamiliesLookUpExists) {
  const char* floats[] = {"f32", "f16", "bf16"};
  std::vector<std::pair<std::string, std::string>> wanted;  // source, entry
  for (const char* dt : floats) {
    wanted.push_back({"norm.cu", absl::StrCat("kiln_norm_", dt)});
    wanted.push_back({"norm.cu", absl::StrCat("kiln_group_norm_", dt)});
    // GroupNorm's split path: statistics and apply, vector and element loads.
    for (const char* k : {"stats_v_", "apply_v_", "stats_s_", "apply_s_"}) {
      wanted.push_back({"norm.cu", absl::StrCat("kiln_group_norm_", k, dt)});
    }
    wanted.push_back({"attention.cu", absl::StrCat("kiln_attention_", dt)});
    for (const char* shape : {"rows_", "cols_"}) {
      wanted.push_back({"softmax.cu", absl::StrCat("kiln_softmax_", shape, dt)});
      wanted.push_back({"reduce.cu", absl::StrCat("kiln_reduce_", shape, dt)});
    }
    wanted.push_back({"rope.cu", absl::StrCat("kiln_rope_", dt)});
    for (const char* loss : {"kiln_xent_", "kiln_mse_", "kiln_loss_sum_"}) {
      wanted.push_back({"loss.cu", absl::StrCat(loss, dt)});
    }
  }
  // Reduce's general path, Cumsum and ArgMax: the float and integer types.
  for (const char* dt : {"f32", "f16", "bf16", "i8", "u8", "i16", "i32", "i64"}) {
    wanted.push_back({"reduce.cu", absl::StrCat("kiln_reduce_gen_", dt)});
    wanted.push_back({"scan.cu", absl::StrCat("kiln_cumsum_", dt)});
    for (const char* it : {"i32", "i64"}) {
      wanted.push_back({"scan.cu", absl::StrCat("kiln_argmax_", dt, "_", it)});
      wanted.push_back({"topk.cu", absl::StrCat("kiln_topk_", dt, "_", it)});
    }
  }
  wanted.push_back({"strided_copy.cu", "kiln_strided_copy_e16"});
  wanted.push_back({"strided_copy.cu", "kiln_strided_copy32_e16"});
  for (int e : {1, 2, 4, 8}) {
    wanted.push_back({"strided_copy.cu", absl::StrCat("kiln_strided_copy_e", e)});
    wanted.push_back({"strided_copy.cu", absl::StrCat("kiln_strided_copy32_e", e)});
    for (DType it : {v1::DTYPE_I32, v1::DTYPE_I64, v1::DTYPE_I16, v1::DTYPE_I8, v1::DTYPE_U8}) {
      wanted.push_back({"gather.cu", absl::StrCat("kiln_gather_e", e, "_", DTypeName(it))});
    }
    wanted.push_back({"pad.cu", absl::StrCat("kiln_pad_e", e)});
  }
  // The split-K decode path: the scalar pair and the combine (the 16-byte
  // kernel's variants are modules of their own: DecodeVariantsCompile).
  for (const char* dt : floats) {
    wanted.push_back({"attention.cu", absl::StrCat("kiln_attention_split_", dt)});
    wanted.push_back({"attention.cu", absl::StrCat("kiln_attention_combine_", dt)});
  }
  for (const char* d : {"64", "128"}) {
    wanted.push_back({"attention_tiled.cu", absl::StrCat("kiln_attention_tiled_f32_d", d)});
    for (const char* dt : {"f16", "bf16"}) {
      wanted.push_back({"flash_attention.cu", absl::StrCat("kiln_flash_attn_fwd_", dt, "_d", d)});
    }
  }
  for (const char* wt : {"q8_0", "q4_0", "q4_k", "q5_k", "q6_k"}) {
    for (const char* dt : floats) {
      for (const char* path : {"matvec_m1", "matvec_m4", "matvec_m8", "matmul"}) {
        wanted.push_back(
            {"dequant_matmul.cu", absl::StrCat("kiln_dequant_", path, "_", wt, "_", dt)});
      }
    }
  }
  for (const auto& [source, entry] : wanted) {
    const absl::StatusOr<std::string>& cubin = FamilyCubin(source);
    ASSERT_TRUE(cubin.ok()) << source << ": " << cubin.status();
    // Symbol names are NUL-terminated in the ELF string table.
    EXPECT_NE(cubin->find(entry + '\0'), std::string::npos) << source << ": " << entry;
  }
}

// DequantMatMul's tensor-core kernel is a module per (block type,
// activation type, tiles of x): every block type and tile count compiles
// (each with some of the others: 15 of the 60 variants, NVRTC being slow)
// and holds its entry point and the split-K reduction.
TEST_F(NvrtcCompileTest, DequantMmaVariantsCompile) {
  const DType acts[] = {v1::DTYPE_F32, v1::DTYPE_BF16, v1::DTYPE_F16};
  const int tile_counts[] = {1, 2, 4, 8};
  int i = 0;
  for (DType wt :
       {v1::DTYPE_Q8_0, v1::DTYPE_Q4_0, v1::DTYPE_Q4_K, v1::DTYPE_Q5_K, v1::DTYPE_Q6_K}) {
    for (int j = 0; j < 3; ++j, ++i) {
      const DType act = acts[i % 3];
      const int tiles = tile_counts[i % 4];
      const std::string entry =
          absl::StrCat("kiln_dequant_mma_n", tiles, "_", DTypeName(wt), "_", DTypeSuffix(act));
      absl::StatusOr<std::string> cubin =
          CompileCubin(entry, DequantMmaSource(wt, act, tiles), kArch);
      ASSERT_TRUE(cubin.ok()) << cubin.status();
      EXPECT_NE(cubin->find(entry + '\0'), std::string::npos) << entry;
      EXPECT_NE(cubin->find(absl::StrCat("kiln_dequant_mma_reduce_", DTypeSuffix(act)) + '\0'),
                std::string::npos)
          << entry;
    }
  }
}

// The matvec kernel with 4 or 8 weight rows per block is a module per
// instance (KILN_DEQUANT_MVR): one compiles and holds its entry point alone.
TEST_F(NvrtcCompileTest, DequantMatVecRowsVariantCompiles) {
  const std::string entry = "kiln_dequant_matvec_r8_m1_q4_k_f32";
  absl::StatusOr<std::string> cubin =
      CompileCubin(entry, DequantMatVecSource(v1::DTYPE_Q4_K, v1::DTYPE_F32, 1, 8), kArch);
  ASSERT_TRUE(cubin.ok()) << cubin.status();
  EXPECT_NE(cubin->find(entry + '\0'), std::string::npos);
  EXPECT_EQ(cubin->find("kiln_dequant_matvec_m1_q4_k_f32"), std::string::npos);
}

// The lt path's dequantize kernel is a module per (block type, activation
// type): one compiles and holds its entry point.
TEST_F(NvrtcCompileTest, DequantToWorkspaceCompiles) {
  const std::string entry = "kiln_dequant_to_q6_k_bf16";
  absl::StatusOr<std::string> cubin =
      CompileCubin(entry, DequantToSource(v1::DTYPE_Q6_K, v1::DTYPE_BF16), kArch);
  ASSERT_TRUE(cubin.ok()) << cubin.status();
  EXPECT_NE(cubin->find(entry + '\0'), std::string::npos);
}

// The 16-byte decode kernel is a module per (dtype, head dim, rows per
// block): each variant's source compiles and holds its entry point.
TEST_F(NvrtcCompileTest, DecodeVariantsCompile) {
  for (DType dt : {v1::DTYPE_F16, v1::DTYPE_BF16}) {
    for (int64_t d : {64, 128, 256}) {
      for (int r : {1, 2, 4, 8}) {
        const std::string entry =
            absl::StrCat("kiln_attention_decode16_", DTypeName(dt), "_d", d, "_r", r);
        absl::StatusOr<std::string> cubin =
            CompileCubin(entry, DecodeAttentionSource(dt, d, r), kArch);
        ASSERT_TRUE(cubin.ok()) << cubin.status();
        EXPECT_NE(cubin->find(entry + '\0'), std::string::npos) << entry;
        // The counters' zeroing kernel the fused combine relies on.
        EXPECT_NE(cubin->find(std::string("kiln_decode_counters_zero") + '\0'), std::string::npos)
            << entry;
        // One entry point per module: no other variant rides along.
        EXPECT_EQ(cubin->find(absl::StrCat("kiln_attention_decode16_", DTypeName(dt), "_d", d,
                                           "_r", r == 1 ? 2 : 1, std::string(1, '\0'))),
                  std::string::npos);
      }
    }
  }
  // The load rings a benchmark sweeps (KILN_DECODE_RING) fit the shared
  // memory of the largest variant (D 256, 8 rows) too.
  for (DecodeRing ring : {DecodeRing{1, 8}, DecodeRing{2, 4}, DecodeRing{2, 5}, DecodeRing{4, 2},
                          DecodeRing{2, 5, 4}}) {
    const std::string entry = "kiln_attention_decode16_bf16_d256_r8";
    absl::StatusOr<std::string> cubin =
        CompileCubin(entry, DecodeAttentionSource(v1::DTYPE_BF16, 256, 8, ring), kArch);
    ASSERT_TRUE(cubin.ok()) << ring.steps << "x" << ring.passes << ": " << cubin.status();
  }
}

// The tensor-core decode kernel is a module per (dtype, head dim): the
// variants of both types and every head dim the plan may pick (4 of the 6,
// NVRTC being slow: bf16 at 64 and 256 differ from f16's only in the mma's
// type), and a swept ring, compile and hold their entry point and the
// counters' zeroing kernel, and nothing of the 16-byte kernel.
TEST_F(NvrtcCompileTest, DecodeMmaVariantsCompile) {
  struct Variant {
    DType dt;
    int64_t d;
    DecodeRing ring;
  };
  for (const Variant& v : {Variant{v1::DTYPE_F16, 64, kDefaultDecodeMmaRing},
                           Variant{v1::DTYPE_BF16, 128, kDefaultDecodeMmaRing},
                           Variant{v1::DTYPE_F16, 256, kDefaultDecodeMmaRing},
                           Variant{v1::DTYPE_BF16, 128, DefaultDecodeMmaRing(v1::DTYPE_BF16, 128)}}) {
    const std::string entry = absl::StrCat("kiln_attention_decode_mma_", DTypeName(v.dt), "_d", v.d);
    absl::StatusOr<std::string> cubin =
        CompileCubin(entry, DecodeMmaAttentionSource(v.dt, v.d, v.ring), kArch);
    ASSERT_TRUE(cubin.ok()) << entry << " " << v.ring.steps << "x" << v.ring.passes << ": "
                            << cubin.status();
    EXPECT_NE(cubin->find(entry + '\0'), std::string::npos) << entry;
    EXPECT_NE(cubin->find(std::string("kiln_decode_counters_zero") + '\0'), std::string::npos)
        << entry;
    EXPECT_EQ(cubin->find("kiln_attention_decode16_"), std::string::npos) << entry;
  }
}

TEST_F(NvrtcCompileTest, UnaryEveryKind) {
  for (int k = v1::UNARY_IDENTITY; k <= v1::UNARY_SOFTPLUS; ++k) {
    if (!v1::UnaryKind_IsValid(k)) continue;
    for (DType dt : kFloats) {
      if (dt != v1::DTYPE_F32 && k != v1::UNARY_GELU && k != v1::UNARY_EXP) continue;
      KernelSpec s = Elementwise(v1::OP_UNARY, {{dt, {4, 33}}}, {dt, {4, 33}},
                                 absl::StrCat("unary_", v1::UnaryKind_Name(k), "_", DTypeName(dt)));
      s.attrs.mutable_unary()->set_kind(static_cast<v1::UnaryKind>(k));
      CompileElementwise(s);
    }
  }
  for (DType dt : kInts) {
    for (auto k : {v1::UNARY_RELU, v1::UNARY_NEG, v1::UNARY_ABS, v1::UNARY_SIGN}) {
      KernelSpec s = Elementwise(v1::OP_UNARY, {{dt, {7}}}, {dt, {7}},
                                 absl::StrCat("unary_", v1::UnaryKind_Name(k), "_", DTypeName(dt)));
      s.attrs.mutable_unary()->set_kind(k);
      CompileElementwise(s);
    }
  }
}

TEST_F(NvrtcCompileTest, BinaryCompareWhereClamp) {
  for (int k = v1::BINARY_ADD; k <= v1::BINARY_POW; ++k) {
    if (!v1::BinaryKind_IsValid(k)) continue;
    for (DType dt : {v1::DTYPE_F32, v1::DTYPE_BF16, v1::DTYPE_I32, v1::DTYPE_I64}) {
      if (k == v1::BINARY_POW && dt != v1::DTYPE_F32 && dt != v1::DTYPE_BF16) continue;
      // Broadcast [3, 1, 5] with [4, 1]: general indexing on both sides.
      KernelSpec s =
          Elementwise(v1::OP_BINARY, {{dt, {3, 1, 5}}, {dt, {4, 1}}}, {dt, {3, 4, 5}},
                      absl::StrCat("binary_", v1::BinaryKind_Name(k), "_", DTypeName(dt)));
      s.attrs.mutable_binary()->set_kind(static_cast<v1::BinaryKind>(k));
      CompileElementwise(s);
    }
  }
  for (int k = v1::COMPARE_EQ; k <= v1::COMPARE_GE; ++k) {
    for (DType dt : {v1::DTYPE_F32, v1::DTYPE_I64}) {
      KernelSpec s = Elementwise(v1::OP_COMPARE, {{dt, {6}}, {dt, {}}}, {v1::DTYPE_BOOL, {6}},
                                 absl::StrCat("compare_", k, "_", DTypeName(dt)));
      s.attrs.mutable_compare()->set_kind(static_cast<v1::CompareKind>(k));
      CompileElementwise(s);
    }
  }
  for (DType dt : {v1::DTYPE_F16, v1::DTYPE_I8}) {
    CompileElementwise(Elementwise(v1::OP_WHERE,
                                   {{v1::DTYPE_BOOL, {2, 3}}, {dt, {2, 3}}, {dt, {3}}},
                                   {dt, {2, 3}}, absl::StrCat("where_", DTypeName(dt))));
  }
  for (DType dt : {v1::DTYPE_F32, v1::DTYPE_BF16, v1::DTYPE_I32, v1::DTYPE_U8}) {
    KernelSpec s =
        Elementwise(v1::OP_CLAMP, {{dt, {9}}}, {dt, {9}}, absl::StrCat("clamp_", DTypeName(dt)));
    s.attrs.mutable_clamp()->set_min(-1.5);
    s.attrs.mutable_clamp()->set_max(200.25);
    CompileElementwise(s);
  }
}

// Inputs read at the output's own index get the 16-byte vectorized loop
// (width = 16 bytes / the widest operand), beside the scalar loop for the
// tail and unaligned launches; a broadcast input keeps the scalar loop only.
TEST_F(NvrtcCompileTest, VectorizedLoopWhereNoInputBroadcasts) {
  KernelSpec gelu = Elementwise(v1::OP_UNARY, {{v1::DTYPE_BF16, {8192, 8192}}},
                                {v1::DTYPE_BF16, {8192, 8192}}, "unary_gelu_bf16_vec");
  gelu.attrs.mutable_unary()->set_kind(v1::UNARY_GELU);
  absl::StatusOr<backend::ElementwiseRegion> region = backend::DecodeSpec(gelu);
  ASSERT_TRUE(region.ok()) << region.status();
  std::string source = GenerateElementwise(gelu, *region);
  EXPECT_NE(source.find("struct alignas(16) kiln_vin0 { unsigned short a[8]; };"),
            std::string::npos)
      << source;
  EXPECT_NE(source.find("& 15ull) == 0ull"), std::string::npos) << source;
  // Two vectors loaded per trip before either is computed.
  EXPECT_NE(source.find("if (two) a0[1] = "), std::string::npos) << source;
  // The result is only stored: the store rounds it, nothing rounds it before.
  EXPECT_NE(source.find("const float v1 = k_gelu_lowp(v0);"), std::string::npos) << source;
  EXPECT_EQ(source.find("k_round_bf16(k_gelu_lowp"), std::string::npos) << source;
  CompileElementwise(gelu);

  // f32 with a scalar operand: 4 lanes; the scalar operand is read as before.
  KernelSpec mixed = Elementwise(v1::OP_BINARY, {{v1::DTYPE_F32, {1001}}, {v1::DTYPE_F32, {}}},
                                 {v1::DTYPE_F32, {1001}}, "binary_add_f32_scalar_vec");
  mixed.attrs.mutable_binary()->set_kind(v1::BINARY_ADD);
  region = backend::DecodeSpec(mixed);
  ASSERT_TRUE(region.ok()) << region.status();
  source = GenerateElementwise(mixed, *region);
  EXPECT_NE(source.find("kiln_vin0 { float a[4]; }"), std::string::npos) << source;
  EXPECT_EQ(source.find("kiln_vin1"), std::string::npos) << source;
  CompileElementwise(mixed);

  KernelSpec bcast = Elementwise(v1::OP_BINARY, {{v1::DTYPE_F16, {4, 64}}, {v1::DTYPE_F16, {64}}},
                                 {v1::DTYPE_F16, {4, 64}}, "binary_add_f16_broadcast");
  bcast.attrs.mutable_binary()->set_kind(v1::BINARY_ADD);
  region = backend::DecodeSpec(bcast);
  ASSERT_TRUE(region.ok()) << region.status();
  source = GenerateElementwise(bcast, *region);
  EXPECT_EQ(source.find("kiln_vin"), std::string::npos) << source;
  CompileElementwise(bcast);
}

TEST_F(NvrtcCompileTest, CastsToAndFromEveryType) {
  for (DType from : kAll) {
    for (DType to : kAll) {
      if (from == to || (from != v1::DTYPE_F32 && to != v1::DTYPE_F32 && from != v1::DTYPE_I64 &&
                         to != v1::DTYPE_I64)) {
        continue;
      }
      KernelSpec s = Elementwise(v1::OP_CAST, {{from, {5, 2}}}, {to, {5, 2}},
                                 absl::StrCat("cast_", DTypeName(from), "_to_", DTypeName(to)));
      s.attrs.mutable_cast()->set_to(to);
      CompileElementwise(s);
    }
  }
}

// A fused region (gelu(x * y + b) and x + 1 as two results, b broadcast,
// an f32 constant), and one whose output needs 64-bit indices.
TEST_F(NvrtcCompileTest, FusedRegionsAndWideIndices) {
  for (int64_t rows : {int64_t{8}, int64_t{1} << 22}) {
    const DType dt = v1::DTYPE_BF16;
    KernelSpec s = Elementwise(v1::OP_FUSED_ELEMENTWISE,
                               {{dt, {rows, 1024}}, {dt, {rows, 1024}}, {dt, {1024}}},
                               {dt, {rows, 1024}}, absl::StrCat("fused_", rows));
    s.outputs.push_back({dt, {rows, 1024}});
    auto* r = s.attrs.mutable_fused_elementwise();
    v1::Attrs mul, add, gelu;
    mul.mutable_binary()->set_kind(v1::BINARY_MUL);
    add.mutable_binary()->set_kind(v1::BINARY_ADD);
    gelu.mutable_unary()->set_kind(v1::UNARY_GELU);
    const int a01[] = {0, 1}, a32[] = {3, 2}, a4[] = {4}, a05[] = {0, 6};
    *r->add_instrs() = backend::InstrFor(v1::OP_BINARY, mul, a01, dt);  // value 3
    *r->add_instrs() = backend::InstrFor(v1::OP_BINARY, add, a32, dt);  // 4
    *r->add_instrs() = backend::InstrFor(v1::OP_UNARY, gelu, a4, dt);   // 5
    v1::FusedInstr one;
    one.set_op(v1::OP_CONSTANT);
    one.set_dtype(dt);
    one.set_scalar(1.0);
    *r->add_instrs() = one;                                             // 6
    *r->add_instrs() = backend::InstrFor(v1::OP_BINARY, add, a05, dt);  // 7
    r->add_results(2);
    r->add_results(4);
    CompileElementwise(s);
  }
}

TEST_F(NvrtcCompileTest, CacheKeyCoversSourceAndArch) {
  const std::string a = CubinCacheKey("x", "sm_90"), b = CubinCacheKey("y", "sm_90");
  EXPECT_NE(a, b);
  EXPECT_NE(a, CubinCacheKey("x", "sm_80"));
  EXPECT_EQ(a, CubinCacheKey("x", "sm_90"));
  EXPECT_EQ(a.rfind("cuda-cubin-", 0), 0u);
}

TEST_F(NvrtcCompileTest, CompileErrorsNameTheKernelAndCarryTheLog) {
  absl::StatusOr<std::string> bad =
      CompileCubin("broken", "extern \"C\" __global__ void f() { nope; }", kArch);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("broken"), absl::string_view::npos);
  EXPECT_NE(bad.status().message().find("nope"), absl::string_view::npos) << bad.status();
}

}  // namespace
}  // namespace kiln::cuda
