#ifndef KNAPFORMER_COMMON_STATUS_MACROS_H_
#define KNAPFORMER_COMMON_STATUS_MACROS_H_

// Debian's abseil 20220623 has no status_macros.h; these are the two we
// need, for every room (the planner, the service, the transports, the tools).

#define KF_CONCAT_INNER_(a, b) a##b
#define KF_CONCAT_(a, b) KF_CONCAT_INNER_(a, b)

#define KF_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::absl::Status kf_status_ = (expr);           \
    if (!kf_status_.ok()) return kf_status_;      \
  } while (0)

#define KF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()

#define KF_ASSIGN_OR_RETURN(lhs, expr) \
  KF_ASSIGN_OR_RETURN_IMPL_(KF_CONCAT_(kf_statusor_, __LINE__), lhs, expr)

#endif  // KNAPFORMER_COMMON_STATUS_MACROS_H_
