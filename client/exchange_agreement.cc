#include "client/exchange_agreement.h"

#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/row_exchange.pb.h"
#include "transport/agreement.h"

namespace knapformer {
namespace {

// REQUIRES: a c10::ScalarType (AgreeOnExchange checks what peers send).
std::string DtypeName(int dtype) { return c10::toString(static_cast<c10::ScalarType>(dtype)); }

std::string ShapeText(const std::vector<int64_t>& trailing) {
  return absl::StrCat("[", absl::StrJoin(trailing, ", "), "]");
}

client::ExchangeCheck CheckOf(const absl::Status& mine, int64_t row_bytes,
                              const ExchangeSignature* signature) {
  client::ExchangeCheck check;
  *check.mutable_verdict() = VerdictOf(mine, row_bytes);
  if (signature != nullptr && mine.ok()) {
    check.set_has_signature(true);
    for (const TensorSignature& t : *signature) {
      client::TensorSignature* out = check.add_tensors();
      out->set_dtype(t.dtype);
      for (int64_t size : t.trailing) out->add_trailing(size);
      out->set_requires_grad(t.requires_grad);
    }
  }
  return check;
}

ExchangeSignature SignatureFrom(const client::ExchangeCheck& check) {
  ExchangeSignature signature;
  for (const client::TensorSignature& t : check.tensors()) {
    signature.push_back({t.dtype(), {t.trailing().begin(), t.trailing().end()},
                         t.requires_grad()});
  }
  return signature;
}

// How `theirs` (world rank `b`) differs from `ours` (world rank `a`), as
// the error every rank returns.
absl::Status SignatureMismatch(const RowMove& move, int a, const ExchangeSignature& ours, int b,
                               const ExchangeSignature& theirs) {
  const std::string call = absl::StrCat(move.what, " at step ", move.step, ": ");
  const std::string rule =
      " (every rank of the group must pass the same number of tensors, and each with the same "
      "dtype, shape after dimension 0 and requires_grad)";
  if (ours.size() != theirs.size()) {
    return absl::InvalidArgumentError(absl::StrCat(call, ours.size(), " tensors on rank ", a,
                                                   " but ", theirs.size(), " on rank ", b, rule));
  }
  for (size_t i = 0; i < ours.size(); ++i) {
    const std::string tensor = ours.size() == 1 ? "the tensor's " : absl::StrCat("tensor ", i, "'s ");
    if (ours[i].dtype != theirs[i].dtype) {
      return absl::InvalidArgumentError(absl::StrCat(call, tensor, "dtype is ",
                                                     DtypeName(ours[i].dtype), " on rank ", a,
                                                     " but ", DtypeName(theirs[i].dtype),
                                                     " on rank ", b, rule));
    }
    if (ours[i].trailing != theirs[i].trailing) {
      return absl::InvalidArgumentError(absl::StrCat(
          call, tensor, "shape after dimension 0 is ", ShapeText(ours[i].trailing), " on rank ",
          a, " but ", ShapeText(theirs[i].trailing), " on rank ", b, rule));
    }
    if (ours[i].requires_grad != theirs[i].requires_grad) {
      return absl::InvalidArgumentError(
          absl::StrCat(call, tensor, "requires_grad is ", ours[i].requires_grad ? "True" : "False",
                       " on rank ", a, " but ", theirs[i].requires_grad ? "True" : "False",
                       " on rank ", b, rule));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status AgreeOnExchange(const RowMove& move, const absl::Status& mine, int64_t row_bytes,
                             const ExchangeSignature* signature) {
  absl::StatusOr<std::vector<client::ExchangeCheck>> all =
      AllGatherMessages(*move.transport, CheckOf(mine, row_bytes, signature));
  if (!all.ok()) return all.status();
  const int n = static_cast<int>(all->size());
  auto world = [&](int p) {
    return p < static_cast<int>(move.world_ranks.size()) ? move.world_ranks[p] : p;
  };
  for (int p = 0; p < n; ++p) {
    absl::Status status =
        StatusOf((*all)[p].verdict(), world(p), absl::StrCat("rank ", world(p), ": "));
    if (!status.ok()) return status;
  }
  for (int p = 0; p < n; ++p) {
    for (const client::TensorSignature& t : (*all)[p].tensors()) {
      if (t.dtype() < 0 || t.dtype() >= static_cast<int>(c10::ScalarType::NumOptions)) {
        return absl::InternalError(absl::StrCat("agreement: rank ", world(p), " sent dtype ",
                                                t.dtype(), ", which is none of torch's"));
      }
    }
  }
  if ((*all)[0].has_signature()) {
    const ExchangeSignature first = SignatureFrom((*all)[0]);
    for (int p = 1; p < n; ++p) {
      if (!(*all)[p].has_signature()) continue;
      absl::Status same = SignatureMismatch(move, world(0), first, world(p), SignatureFrom((*all)[p]));
      if (!same.ok()) return same;
    }
  }
  // Backward passes carry no signature; their row sizes must still match.
  std::vector<agreement::Verdict> verdicts;
  for (const client::ExchangeCheck& check : *all) verdicts.push_back(check.verdict());
  absl::Status rows = FirstFailure(verdicts);
  if (!rows.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(move.what, " at step ", move.step, ": ",
                                                   rows.message()));
  }
  return absl::OkStatus();
}

}  // namespace knapformer
