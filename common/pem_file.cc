#include "common/pem_file.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace knapformer {

absl::Status CheckPemFiles(
    const std::vector<std::pair<std::string, std::string>>& fields_and_paths) {
  for (const auto& [field, path] : fields_and_paths) {
    if (path.empty()) continue;
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read '", path, "'"));
    }
    std::ostringstream text;
    text << in.rdbuf();
    if (text.str().find("-----BEGIN") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' is not a PEM file"));
    }
  }
  return absl::OkStatus();
}

unsigned int PemRefreshSeconds(absl::Duration interval) {
  return static_cast<unsigned int>(std::max<int64_t>(1, absl::ToInt64Seconds(interval)));
}

}  // namespace knapformer
