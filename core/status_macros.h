// Macros that keep absl::Status error paths to one line.
//
//   RETURN_IF_ERROR(expr);           // returns the status of `expr` if not OK
//   ASSIGN_OR_RETURN(auto x, expr);  // `expr` is a StatusOr; returns its status if not OK
#ifndef STRATA_CORE_STATUS_MACROS_H_
#define STRATA_CORE_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define STRATA_CONCAT_INNER_(a, b) a##b
#define STRATA_CONCAT_(a, b) STRATA_CONCAT_INNER_(a, b)

#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    const ::absl::Status strata_status_ = (expr);    \
    if (!strata_status_.ok()) return strata_status_; \
  } while (0)

#define ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_CONCAT_(strata_statusor_, __LINE__), lhs, expr)

#define STRATA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  if (!statusor.ok()) return statusor.status();            \
  lhs = std::move(statusor).value()

#endif  // STRATA_CORE_STATUS_MACROS_H_
