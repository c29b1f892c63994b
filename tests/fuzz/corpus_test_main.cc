// Runs a fuzzer's entry point over every file of its corpus directory
// (argv[1], relative to the runfiles root): the seeds, and every input that
// once broke something, replayed by the ordinary test suite.
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::string corpus_dir;

TEST(Corpus, EveryInputKeepsEveryProperty) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(corpus_dir)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  ASSERT_FALSE(files.empty()) << "no seeds in " << corpus_dir;
  std::sort(files.begin(), files.end());
  for (const std::filesystem::path& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)),
                            std::istreambuf_iterator<char>());
    SCOPED_TRACE(file.string());
    // A broken property aborts the process, failing the test with its message.
    EXPECT_EQ(LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                                     bytes.size()),
              0);
  }
  std::printf("%zu inputs from %s\n", files.size(), corpus_dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  corpus_dir = argv[1];
  return RUN_ALL_TESTS();
}
