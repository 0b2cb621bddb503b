// Writes the binary seeds of two fuzz targets from sources kept readable in the
// tree (docs/development.md, "Fuzzing"):
//   kiln_fuzz_seeds graph_ingest <out_dir> <file.kiln>...   each graph's wire form
//   kiln_fuzz_seeds cache_entry <out_dir>                   entries DiskCache wrote
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/compile/disk_cache.h"
#include "engine/ir/text.h"

namespace {

bool WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

int GraphSeeds(const std::string& out_dir, int argc, char** argv) {
  int written = 0;
  for (int i = 0; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    auto proto = kiln::ir::ParseGraphProto(text.str());
    if (!proto.ok()) {
      std::fprintf(stderr, "%s: skipped: %s\n", argv[i], proto.status().ToString().c_str());
      continue;
    }
    const std::string name = std::filesystem::path(argv[i]).stem().string() + ".pb";
    if (!WriteFile(out_dir + "/" + name, proto->SerializeAsString())) return 1;
    ++written;
  }
  std::printf("%d graph seeds\n", written);
  return written > 0 ? 0 : 1;
}

int CacheSeeds(const std::string& out_dir) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "kiln_fuzz_seeds_cache";
  fs::remove_all(dir);
  auto cache = kiln::compile::DiskCache::Create({.dir = dir.string()});
  if (!cache.ok()) return 1;
  const std::string key(64, 'a');
  const std::string payloads[] = {"", "x", std::string(300, '\x5a'), "serialized executable bytes"};
  int n = 0;
  for (const std::string& payload : payloads) {
    for (auto level : {kiln::compile::CacheLevel::kExecutable, kiln::compile::CacheLevel::kKernel}) {
      if (!(*cache)->Store(level, key, payload).ok()) return 1;
      const fs::path entry = dir / kiln::compile::CacheLevelDirName(level) / "aa" / key;
      std::ifstream in(entry, std::ios::binary);
      std::stringstream bytes;
      bytes << in.rdbuf();
      // Control byte (cache_entry_fuzz.cc): look up under the header's key, at this level.
      const char control = static_cast<char>(
          4 | (level == kiln::compile::CacheLevel::kKernel ? 8 : 0));
      if (!WriteFile(out_dir + "/entry_" + std::to_string(n++), control + bytes.str())) return 1;
    }
  }
  fs::remove_all(dir);
  std::printf("%d cache seeds\n", n);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "graph_ingest") return GraphSeeds(argv[2], argc - 3, argv + 3);
  if (argc == 3 && std::string(argv[1]) == "cache_entry") return CacheSeeds(argv[2]);
  std::fprintf(stderr, "usage: kiln_fuzz_seeds graph_ingest <out_dir> <file.kiln>... | cache_entry <out_dir>\n");
  return 2;
}
