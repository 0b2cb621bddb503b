#include "engine/compile/cache_key.h"

#include <string>

#include "gtest/gtest.h"

namespace kiln::compile {
namespace {

TEST(CacheKeySha256Test, MatchesKnownVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

CacheKey ExampleKey() {
  CacheKey key;
  key.Add(kKeyKilnVersion, kCompilerVersion)
      .Add(kKeyLirFormat, "3")
      .Add("graph", std::string("\x01\x02graph bytes\0with nul", 22))
      .Add("device", "cpu:x86-64-v3+avx512");
  return key;
}

TEST(CacheKeyTest, HexIsDeterministicSha256) {
  const std::string hex = ExampleKey().Hex();
  EXPECT_EQ(hex.size(), 64u);
  EXPECT_EQ(hex.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(ExampleKey().Hex(), hex);
  EXPECT_NE(CacheKey().Hex(), hex);
}

TEST(CacheKeyTest, EveryValueByteMatters) {
  CacheKey a = ExampleKey();
  CacheKey b;
  b.Add(kKeyKilnVersion, kCompilerVersion)
      .Add(kKeyLirFormat, "3")
      .Add("graph", std::string("\x01\x02graph bytes\0with nuL", 22))
      .Add("device", "cpu:x86-64-v3+avx512");
  EXPECT_NE(a.Hex(), b.Hex());
}

TEST(CacheKeyTest, ComponentBoundariesCannotShift) {
  CacheKey ab_c, a_bc, abc;
  ab_c.Add("x", "ab").Add("y", "c");
  a_bc.Add("x", "a").Add("y", "bc");
  abc.Add("x", "abc");
  EXPECT_NE(ab_c.Hex(), a_bc.Hex());
  EXPECT_NE(ab_c.Hex(), abc.Hex());

  // A name cannot absorb the start of its value either.
  CacheKey name_long, value_long;
  name_long.Add("ab", "c");
  value_long.Add("a", "bc");
  EXPECT_NE(name_long.Hex(), value_long.Hex());

  // An empty component is still a component.
  CacheKey with_empty;
  with_empty.Add("x", "abc").Add("", "");
  EXPECT_NE(with_empty.Hex(), abc.Hex());
}

TEST(CacheKeyTest, OrderMatters) {
  CacheKey first, second;
  first.Add("a", "1").Add("b", "2");
  second.Add("b", "2").Add("a", "1");
  EXPECT_NE(first.Hex(), second.Hex());
}

TEST(CacheKeyTest, ComponentsShowShortTextAndHashTheRest) {
  std::vector<v1::KeyComponent> components = ExampleKey().Components();
  ASSERT_EQ(components.size(), 4u);
  EXPECT_EQ(components[0].name(), "kiln_version");
  EXPECT_EQ(components[0].digest(), kCompilerVersion);
  EXPECT_EQ(components[1].name(), "lir_format");
  EXPECT_EQ(components[1].digest(), "3");
  EXPECT_EQ(components[2].name(), "graph");  // binary: hashed
  EXPECT_EQ(components[2].digest(), Sha256Hex(std::string("\x01\x02graph bytes\0with nul", 22)));
  EXPECT_EQ(components[3].digest(), "cpu:x86-64-v3+avx512");

  CacheKey long_text;
  const std::string text(CacheKey::kMaxInlineValueBytes + 1, 'x');
  long_text.Add("flags", text).Add("empty", "");
  components = long_text.Components();
  EXPECT_EQ(components[0].digest(), Sha256Hex(text));
  EXPECT_EQ(components[1].digest(), Sha256Hex(""));
}

TEST(CacheKeyTest, ExplainIsEmptyForEqualKeys) {
  EXPECT_EQ(ExampleKey().Explain(ExampleKey()), "");
}

TEST(CacheKeyTest, ExplainNamesChangedComponents) {
  CacheKey old_key = ExampleKey();
  CacheKey new_key;
  new_key.Add(kKeyKilnVersion, kCompilerVersion)
      .Add(kKeyLirFormat, "4")
      .Add("graph", "another graph\x01")
      .Add("device", "cpu:x86-64-v3+avx512");
  const std::string why = old_key.Explain(new_key);
  EXPECT_NE(why.find("lir_format: \"3\" -> \"4\""), std::string::npos) << why;
  EXPECT_NE(why.find("graph: " +
                     Sha256Hex(std::string("\x01\x02graph bytes\0with nul", 22)).substr(0, 12)),
            std::string::npos)
      << why;
  EXPECT_EQ(why.find("device"), std::string::npos) << why;
  EXPECT_EQ(why.find("kiln_version"), std::string::npos) << why;
}

TEST(CacheKeyTest, ExplainNamesMissingComponentsAndReordering) {
  CacheKey a, b;
  a.Add("graph", "g").Add("shapes", "[1,2]");
  b.Add("graph", "g").Add("device", "sm_90");
  EXPECT_EQ(a.Explain(b), "only in this: shapes; only in other: device");

  CacheKey c, d;
  c.Add("x", "1").Add("y", "2");
  d.Add("y", "2").Add("x", "1");
  EXPECT_EQ(c.Explain(d), "component order differs: [x, y] -> [y, x]");
}

TEST(CacheKeyTest, ExplainMatchesRepeatedNamesByOccurrence) {
  CacheKey a, b;
  a.Add("input", "f32[1]").Add("input", "f32[2]");
  b.Add("input", "f32[1]").Add("input", "f32[3]");
  EXPECT_EQ(a.Explain(b), "input: \"f32[2]\" -> \"f32[3]\"");
}

TEST(CacheKeyTest, ComponentsAlikeCountsEqualDigestsByName) {
  CacheKey a, b;
  a.Add("graph", "g").Add("options", "fusion=1").Add("input_shapes", "x:f32[2];");
  b.Add("graph", "g").Add("options", "fusion=0").Add("input_shapes", "x:f32[2];");
  EXPECT_EQ(ComponentsAlike(a.Components(), a.Components()), 3);
  EXPECT_EQ(ComponentsAlike(a.Components(), b.Components()), 2);
  CacheKey c;
  c.Add("input_shapes", "x:f32[2];").Add("graph", "g");  // order does not matter here
  EXPECT_EQ(ComponentsAlike(a.Components(), c.Components()), 2);
  EXPECT_EQ(ComponentsAlike(a.Components(), CacheKey().Components()), 0);
}

TEST(CacheKeyTest, ExplainComponentsWorksOnDigestsAlone) {
  CacheKey old_key = ExampleKey();
  CacheKey new_key;
  new_key.Add(kKeyKilnVersion, kCompilerVersion)
      .Add(kKeyLirFormat, "4")
      .Add("graph", "another graph\x01")
      .Add("device", "cpu:x86-64-v3+avx512");
  const std::string why = ExplainComponents(old_key.Components(), new_key.Components());
  // As CacheKey::Explain says it, from the digests a cache keeps.
  EXPECT_EQ(why, old_key.Explain(new_key));
  EXPECT_EQ(why, "lir_format: \"3\" -> \"4\"; graph: " +
                     Sha256Hex(std::string("\x01\x02graph bytes\0with nul", 22)).substr(0, 12) +
                     ".. -> " + Sha256Hex("another graph\x01").substr(0, 12) + "..");
  EXPECT_EQ(ExplainComponents(old_key.Components(), ExampleKey().Components()), "");

  CacheKey a, b, c, d;
  a.Add("graph", "g").Add("shapes", "[1,2]");
  b.Add("graph", "g").Add("device", "sm_90");
  EXPECT_EQ(ExplainComponents(a.Components(), b.Components()),
            "only in this: shapes; only in other: device");
  c.Add("x", "1").Add("y", "2");
  d.Add("y", "2").Add("x", "1");
  EXPECT_EQ(ExplainComponents(c.Components(), d.Components()),
            "component order differs: [x, y] -> [y, x]");
}

}  // namespace
}  // namespace kiln::compile
