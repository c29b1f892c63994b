#ifndef KNAPFORMER_SERVER_WATCHED_FILE_H_
#define KNAPFORMER_SERVER_WATCHED_FILE_H_

// A small text file (a key file, a revocation list) that is read again at
// most once per interval and taken anew when its content changed: by
// content, not modification time or size, so a rewrite of the same size
// within one tick of the file system's clock is seen. Only whole lines
// count: a last line without its newline is still being written and is not
// taken. A file that cannot be read, or whose lines the parser refuses, has
// no value until it is fixed, so that its user fails closed (a deleted key
// file refuses every token; it does not keep the keys it once held).

#include <fstream>
#include <functional>
#include <memory>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace knapformer {

struct FileLine {
  int number = 0;  // from 1
  absl::string_view text;  // without its newline
};

struct FileLines {
  std::vector<FileLine> whole;
  // The content ends in a line without its newline (not in `whole`).
  bool unterminated = false;
};

// The whole lines of `content`.
inline FileLines WholeLines(absl::string_view content) {
  FileLines lines;
  int number = 1;
  size_t start = 0;
  for (size_t end; (end = content.find('\n', start)) != absl::string_view::npos;
       start = end + 1, ++number) {
    lines.whole.push_back(FileLine{number, content.substr(start, end - start)});
  }
  lines.unterminated = start < content.size();
  return lines;
}

// The content of `path`; NotFound naming it ("<what> <path>: cannot be
// read") when it cannot be read.
inline absl::StatusOr<std::string> ReadSmallFile(absl::string_view what,
                                                 const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.is_open() || in.bad()) {
    return absl::NotFoundError(absl::StrCat(what, " ", path, ": cannot be read"));
  }
  return content;
}

// Thread-safe.
template <typename T>
class WatchedFile {
 public:
  // `parse` makes the value from the file's whole lines (its errors name the
  // file and line).
  using Parse = std::function<absl::StatusOr<T>(const std::string& path,
                                                const FileLines& lines)>;

  // `what` names the file in errors ("key file").
  WatchedFile(std::string what, std::string path, absl::Duration interval, Parse parse)
      : what_(std::move(what)),
        path_(std::move(path)),
        interval_(interval),
        parse_(std::move(parse)) {}

  const std::string& path() const { return path_; }

  // The value of the file as last read, or why there is none. Reads the
  // file when `interval` has passed since the last look (at once the first
  // time); *changed (optional) tells whether this call took a new version or
  // a new error.
  absl::StatusOr<std::shared_ptr<const T>> Current(bool* changed = nullptr) {
    absl::MutexLock lock(&mu_);
    if (changed != nullptr) *changed = false;
    const absl::Time now = absl::Now();
    if (looked_ && now - last_look_ < interval_) return value_;
    looked_ = true;
    last_look_ = now;
    absl::StatusOr<std::string> content = ReadSmallFile(what_, path_);
    if (content.ok() && has_content_ && *content == content_) return value_;
    const absl::Status before = value_.status();
    if (!content.ok()) {
      has_content_ = false;
      value_ = content.status();
    } else {
      content_ = *std::move(content);
      has_content_ = true;
      absl::StatusOr<T> parsed = parse_(path_, WholeLines(content_));
      if (parsed.ok()) {
        value_ = std::make_shared<const T>(*std::move(parsed));
      } else {
        value_ = parsed.status();
      }
    }
    if (changed != nullptr) *changed = value_.ok() || value_.status() != before;
    return value_;
  }

 private:
  const std::string what_;
  const std::string path_;
  const absl::Duration interval_;
  const Parse parse_;
  absl::Mutex mu_;
  bool looked_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time last_look_ ABSL_GUARDED_BY(mu_);
  bool has_content_ ABSL_GUARDED_BY(mu_) = false;
  std::string content_ ABSL_GUARDED_BY(mu_);
  absl::StatusOr<std::shared_ptr<const T>> value_ ABSL_GUARDED_BY(mu_) =
      absl::UnavailableError("not read yet");
};

}  // namespace knapformer

#endif  // KNAPFORMER_SERVER_WATCHED_FILE_H_
