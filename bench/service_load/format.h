#ifndef KNAPFORMER_BENCH_SERVICE_LOAD_FORMAT_H_
#define KNAPFORMER_BENCH_SERVICE_LOAD_FORMAT_H_

// How the service load benchmark writes numbers in its tables and status
// codes in its reports.

#include <string>

namespace knapformer {
namespace service_load {

// `value` with `digits` decimals; "n/a" for NaN.
std::string Fixed(double value, int digits);

// A gRPC status code's name ("UNAVAILABLE"); "?" for one out of range.
const char* CodeName(int code);

}  // namespace service_load
}  // namespace knapformer

#endif  // KNAPFORMER_BENCH_SERVICE_LOAD_FORMAT_H_
