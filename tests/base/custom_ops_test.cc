// CustomOpRegistry's checks of a plugin's description, in-process (the
// dlopen path and the refusals in kilnd's log: ServerPlugins).
#include "base/custom_ops.h"

#include <gtest/gtest.h>

#include <cstdio>

#include <string>

namespace kiln {
namespace {

int Shape(const void*, size_t, const KilnTensorType* in, int32_t n, KilnTensorType* out,
          int32_t* num_out, char* error, size_t error_size) {
  if (n != 1) {
    snprintf(error, error_size, "bad\nthing");
    return 1;
  }
  out[0] = in[0];
  *num_out = 1;
  return 0;
}

int Kernel(const void*, size_t, const KilnTensor*, int32_t, KilnTensor*, int32_t, char*, size_t) {
  return 0;
}

KilnPlugin Plugin(const KilnCustomOp* ops, int32_t n) {
  return KilnPlugin{KILN_PLUGIN_ABI_VERSION, sizeof(KilnPlugin), "p", "1", n, ops};
}

TEST(CustomOps, RegisterChecksThePluginDescription) {
  CustomOpRegistry r;
  const KilnCustomOp good[] = {{"t.a", Shape, Kernel, {}}};
  KilnPlugin p = Plugin(good, 1);
  p.struct_size = 8;
  EXPECT_NE(r.Register(p, "", "").message().find("struct_size 8"), std::string::npos);
  p = Plugin(good, 1);
  p.abi_version = 2;
  EXPECT_NE(r.Register(p, "", "").message().find("ABI version 2"), std::string::npos);
  const KilnCustomOp unnamed[] = {{"", Shape, Kernel, {}}};
  EXPECT_NE(r.Register(Plugin(unnamed, 1), "", "").message().find("name is empty"), std::string::npos);
  const KilnCustomOp spaced[] = {{"t b", Shape, Kernel, {}}};
  EXPECT_NE(r.Register(Plugin(spaced, 1), "", "").message().find("outside printable ASCII"),
            std::string::npos);
  const KilnCustomOp no_shape[] = {{"t.b", nullptr, Kernel, {}}};
  EXPECT_NE(r.Register(Plugin(no_shape, 1), "", "").message().find("no shape function"), std::string::npos);
  int gpu = 0;
  const KilnCustomOp reserved[] = {{"t.c", Shape, Kernel, {&gpu, nullptr, nullptr, nullptr}}};
  EXPECT_NE(r.Register(Plugin(reserved, 1), "", "").message().find("GPU kernels are not in ABI version 1"),
            std::string::npos);
  const KilnCustomOp twice[] = {{"t.d", Shape, Kernel, {}}, {"t.d", Shape, Kernel, {}}};
  EXPECT_NE(r.Register(Plugin(twice, 2), "", "").message().find("listed twice"), std::string::npos);
  EXPECT_TRUE(r.Names().empty());  // nothing half-registered

  ASSERT_TRUE(r.Register(Plugin(good, 1), "/x/libp.so", "abc").ok());
  const CustomOp* op = r.Find("t.a");
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->Identity(), "t.a|p|1|abc");
  EXPECT_TRUE(absl::IsAlreadyExists(r.Register(Plugin(good, 1), "", "")));
}

TEST(CustomOps, ShapeFunctionFailuresAreEscaped) {
  CustomOpRegistry r;
  const KilnCustomOp ops[] = {{"t.a", Shape, Kernel, {}}};
  ASSERT_TRUE(r.Register(Plugin(ops, 1), "", "").ok());
  auto s = CallShapeFunction(*r.Find("t.a"), "", {});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("\"bad\\nthing\""), std::string::npos) << s.status();
  KilnTensorType t{};
  t.dtype = KILN_DTYPE_F32;
  auto ok = CallShapeFunction(*r.Find("t.a"), "", {t});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 1u);
  EXPECT_EQ(QuotePluginString(std::string(200, 'a'), 4), "\"aaaa...\"(+196 bytes)");
}

}  // namespace
}  // namespace kiln
