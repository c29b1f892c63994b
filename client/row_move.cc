#include "client/row_move.h"

#include <functional>
#include <numeric>

#include <ATen/ATen.h>

namespace knapformer {
namespace {

bool IsIdentity(const std::vector<int64_t>& index) {
  for (size_t i = 0; i < index.size(); ++i) {
    if (index[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

}  // namespace

RowOrder RowOrder::Of(const std::vector<int64_t>& rows) {
  if (IsIdentity(rows)) return {};
  std::vector<int64_t> inverse(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) inverse[rows[i]] = static_cast<int64_t>(i);
  at::Tensor index = at::tensor(rows, at::kLong);
  at::Tensor inverted = at::tensor(inverse, at::kLong);
  return {index, inverted, index, inverted};
}

ExchangeSignature SignatureOf(const std::vector<at::Tensor>& xs) {
  ExchangeSignature signature;
  for (const at::Tensor& x : xs) {
    std::vector<int64_t> trailing(x.sizes().begin() + (x.dim() > 0 ? 1 : 0), x.sizes().end());
    signature.push_back(
        {static_cast<int>(x.scalar_type()), std::move(trailing), x.requires_grad()});
  }
  return signature;
}

const ExchangeBook::Entry* ExchangeBook::Expected(const std::string& call, int ordinal) const {
  auto it = agreed_.find(call);
  if (it == agreed_.end() || it->second.empty()) return nullptr;
  const std::vector<Entry>& entries = it->second;
  return ordinal >= 0 && ordinal < static_cast<int>(entries.size()) ? &entries[ordinal]
                                                                    : &entries.back();
}

void ExchangeBook::Record(const std::string& call, int ordinal, Entry entry) {
  std::vector<Entry>& entries = agreed_[call];
  if (ordinal < 0) return;
  if (ordinal >= static_cast<int>(entries.size())) {
    // Ordinals come in order within a step; one never seen extends the list
    // (with the call's last entry between, should a call have been skipped).
    entries.resize(ordinal + 1, entries.empty() ? entry : entries.back());
  }
  entries[ordinal] = std::move(entry);
}

int64_t RowElements(const at::Tensor& x) {
  return std::accumulate(x.sizes().begin() + 1, x.sizes().end(), int64_t{1},
                         std::multiplies<int64_t>());
}

}  // namespace knapformer
