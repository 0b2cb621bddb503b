// The CUDA backend's prepare-cache entries (backends/cuda/prepare_cache.h):
// cuDNN plans and cuBLASLt algorithms kept beside cubins in the kernel level
// of the compile cache. No GPU needed: the keys are content addresses over
// every component, and an entry of another kind, version or key, or a
// truncated one, is refused (the backend then asks the library again).
#include "backends/cuda/prepare_cache.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "absl/strings/match.h"

namespace kiln::cuda {
namespace {

using Components = std::vector<std::pair<std::string, std::string>>;

TEST(PrepareCacheKey, NamesItsKindAndSeparatesEveryComponent) {
  const Components base = {{"plan", "cudnn_sdpa_fwd;b=4"}, {"device", "H100|sm_90|sm=132"}};
  const std::string key = PrepareCacheKey("cudnn-plan", base);
  EXPECT_TRUE(absl::StartsWith(key, "cudnn-plan-")) << key;
  EXPECT_EQ(key.size(), std::string("cudnn-plan-").size() + 64);
  EXPECT_EQ(key, PrepareCacheKey("cudnn-plan", base)) << "deterministic";
  std::set<std::string> keys = {key};
  // Another kind, value, name, order, or a value moved across the boundary
  // between two components: each a key of its own.
  keys.insert(PrepareCacheKey("cublaslt-algo", base));
  keys.insert(PrepareCacheKey("cudnn-plan", {{"plan", "cudnn_sdpa_fwd;b=8"}, base[1]}));
  keys.insert(PrepareCacheKey("cudnn-plan", {{"shape", "cudnn_sdpa_fwd;b=4"}, base[1]}));
  keys.insert(PrepareCacheKey("cudnn-plan", {base[1], base[0]}));
  keys.insert(PrepareCacheKey("cudnn-plan",
                              {{"plan", "cudnn_sdpa_fwd;b=4H100"}, {"device", "|sm_90|sm=132"}}));
  keys.insert(PrepareCacheKey("cudnn-plan", {base[0]}));
  EXPECT_EQ(keys.size(), 7u);
}

TEST(PrepareCacheEntry, RoundTripsItsPayload) {
  const std::string key = PrepareCacheKey("cudnn-plan", {{"plan", "p"}});
  // Payloads may hold any bytes (a cuBLASLt algorithm is raw binary).
  const std::string payload = std::string("{\"engine\":7}\n\0\x01\xff", 16);
  const std::string entry = EncodePrepareEntry("cudnn-plan", key, payload);
  const std::optional<std::string> back = DecodePrepareEntry("cudnn-plan", key, entry);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, payload);
}

TEST(PrepareCacheEntry, RefusesForeignDamagedAndEmptyEntries) {
  const std::string key = PrepareCacheKey("cublaslt-algo", {{"shape", "s"}});
  const std::string other = PrepareCacheKey("cublaslt-algo", {{"shape", "t"}});
  const std::string payload(64, '\x5a');
  const std::string entry = EncodePrepareEntry("cublaslt-algo", key, payload);
  // Another key's entry (a file under the wrong name) or kind.
  EXPECT_FALSE(DecodePrepareEntry("cublaslt-algo", other, entry).has_value());
  EXPECT_FALSE(DecodePrepareEntry("cudnn-plan", key, entry).has_value());
  // Another format version.
  std::string versioned = entry;
  versioned.replace(versioned.find(' ') + 1, 1, "9");
  EXPECT_FALSE(DecodePrepareEntry("cublaslt-algo", key, versioned).has_value());
  // Truncated into the header, no payload, garbage, nothing.
  EXPECT_FALSE(DecodePrepareEntry("cublaslt-algo", key, entry.substr(0, 20)).has_value());
  EXPECT_FALSE(
      DecodePrepareEntry("cublaslt-algo", key, EncodePrepareEntry("cublaslt-algo", key, ""))
          .has_value());
  EXPECT_FALSE(DecodePrepareEntry("cublaslt-algo", key, std::string(300, 'x')).has_value());
  EXPECT_FALSE(DecodePrepareEntry("cublaslt-algo", key, "").has_value());
}

}  // namespace
}  // namespace kiln::cuda
