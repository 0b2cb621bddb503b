#include "engine/io/npz.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kiln::io {
namespace {

using ::testing::HasSubstr;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Temp(const std::string& name) {
  return ::testing::TempDir() + "/npz_test_" + std::to_string(::getpid()) + "_" + name;
}

TEST(Npz, RoundTripsAndNumpyReadsIt) {
  HostTensor a = HostTensor::FromVector<float>(v1::DTYPE_F32, {2, 3}, {1, 2, 3, 4, 5, 6});
  HostTensor b = HostTensor::FromVector<int64_t>(v1::DTYPE_I64, {2}, {-7, 9});
  absl::StatusOr<std::string> bytes = SerializeNpz({{"w", &a}, {"step", &b}});
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  auto back = ParseNpz(*bytes, "mem");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ((*back)[0].first, "w");
  EXPECT_EQ((*back)[0].second.bytes(), a.bytes());
  EXPECT_EQ((*back)[1].second.GetAsDouble(0), -7);
  // numpy.load reads what we write, and we read what numpy.savez_compressed writes.
  const std::string ours = Temp("ours.npz"), theirs = Temp("theirs.npz");
  std::ofstream(ours, std::ios::binary) << *bytes;
  const std::string py = "/usr/bin/python3 -c \"import numpy as np; d = np.load('" + ours +
                         "'); assert d['w'].tolist() == [[1, 2, 3], [4, 5, 6]] and d['step'].tolist() == [-7, 9]; "
                         "np.savez_compressed('" + theirs +
                         "', x=np.arange(12, dtype=np.float64).reshape(3, 4), m=np.array([True, False]))\"";
  ASSERT_EQ(std::system(py.c_str()), 0) << py;
  auto np = ReadNpz(theirs);
  ASSERT_TRUE(np.ok()) << np.status();
  ASSERT_EQ(np->size(), 2u);
  EXPECT_EQ((*np)[0].first, "x");
  EXPECT_EQ((*np)[0].second.dims(), (Dims{3, 4}));
  EXPECT_EQ((*np)[0].second.GetAsDouble(11), 11);
  EXPECT_EQ((*np)[1].second.dtype(), v1::DTYPE_BOOL);
  ::unlink(ours.c_str());
  ::unlink(theirs.c_str());
}

TEST(Npz, RefusesHostileArchives) {
  HostTensor a = HostTensor::FromVector<float>(v1::DTYPE_F32, {4}, {1, 2, 3, 4});
  absl::StatusOr<std::string> good = SerializeNpz({{"w", &a}});
  ASSERT_TRUE(good.ok());
  EXPECT_THAT(std::string(ParseNpz("not a zip", "x").status().message()), HasSubstr("not a readable zip archive"));
  EXPECT_THAT(std::string(ParseNpz(good->substr(0, good->size() - 10), "x").status().message()),
              HasSubstr("not a readable zip archive"));
  // A zip bomb: python writes one entry that inflates to 64 MiB; the limit here is 1 MiB.
  const std::string bomb = Temp("bomb.npz");
  const std::string py = "/usr/bin/python3 -c \"import numpy as np; np.savez_compressed('" + bomb +
                         "', z=np.zeros(16 << 20, dtype=np.float32))\"";
  ASSERT_EQ(std::system(py.c_str()), 0);
  const std::string bomb_bytes = ReadAll(bomb);
  EXPECT_LT(bomb_bytes.size(), 1u << 20);
  NpzLimits small;
  small.max_total_bytes = 1 << 20;
  absl::Status s = ParseNpz(bomb_bytes, "bomb.npz", small).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("past the limit of 1048576 bytes"));
  // An entry that is not an array, and a name given twice.
  const std::string odd = Temp("odd.npz");
  const std::string py2 = "/usr/bin/python3 -c \"import zipfile; z = zipfile.ZipFile('" + odd +
                          "', 'w'); z.writestr('readme.txt', 'hi'); z.close()\"";
  ASSERT_EQ(std::system(py2.c_str()), 0);
  EXPECT_THAT(std::string(ReadNpz(odd).status().message()), HasSubstr("entry 'readme.txt' is not a .npy file"));
  EXPECT_THAT(std::string(SerializeNpz({{"w", &a}, {"w", &a}}).status().message()), HasSubstr("given twice"));
  // A .npy entry whose bytes are not a valid array.
  const std::string junk = Temp("junk.npz");
  const std::string py3 = "/usr/bin/python3 -c \"import zipfile; z = zipfile.ZipFile('" + junk +
                          "', 'w'); z.writestr('a.npy', b'\\\\x93NUMPY junk'); z.close()\"";
  ASSERT_EQ(std::system(py3.c_str()), 0);
  EXPECT_FALSE(ReadNpz(junk).ok());
  ::unlink(bomb.c_str());
  ::unlink(odd.c_str());
  ::unlink(junk.c_str());
}

}  // namespace
}  // namespace kiln::io
