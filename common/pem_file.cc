#include "common/pem_file.h"

#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace knapformer {

absl::StatusOr<std::string> ReadPemFile(const std::string& field, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": cannot read '", path, "'"));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN") == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' is not a PEM file"));
  }
  return text.str();
}

}  // namespace knapformer
