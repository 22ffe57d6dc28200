#include "tools/bench/kernel_bench.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "kernels/adam.h"
#include "kernels/elementwise.h"
#include "kernels/grad_stats.h"
#include "kernels/int8_adam.h"
#include "kernels/isa.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/memory_probe.h"

namespace strata {
namespace {

using nlohmann::json;

absl::Status Validate(const KernelBenchOptions& o) {
  if (o.num_params == 0 || o.num_params % 64 != 0) {
    return absl::InvalidArgumentError("--params must be a positive multiple of 64");
  }
  if (o.threads < 1 || o.reps < 1) {
    return absl::InvalidArgumentError("--threads and --reps must be >= 1");
  }
  if (BestProbes() == nullptr) return absl::FailedPreconditionError("the memory probes need AVX2");
  return absl::OkStatus();
}

// Fills `num_bytes` with `byte` on the pool's threads (first touch).
void Fill(ThreadPool& pool, uint8_t* data, size_t num_bytes, uint8_t byte) {
  TimeChunks(pool, num_bytes, [&](size_t b, size_t e) { std::memset(data + b, byte, e - b); });
}

// Fills n elements of `dtype` with the chunk-sized pattern `values`.
void FillValues(ThreadPool& pool, uint8_t* data, DType dtype, size_t n,
                const std::vector<float>& values) {
  TimeChunks(pool, n, [&](size_t b, size_t e) {
    CastFromFloat(values.data(), dtype, data + b * DTypeSize(dtype), e - b);
  });
}

// Fills n elements of `dtype` with `value` (a normal number in every dtype,
// so that no denormal slows the arithmetic down).
void FillValue(ThreadPool& pool, uint8_t* data, DType dtype, size_t n, float value) {
  FillValues(pool, data, dtype, n, std::vector<float>(kBenchChunkElements, value));
}

// Gradients ±value 2^-k, with k spread over [0, binades) and the sign drawn
// by a hash of the element's place: a trained layer's gradients span tens of
// binades, their squares (Adam's v) twice as many.
std::vector<float> SpreadGradients(float value, int binades) {
  std::vector<float> values(kBenchChunkElements);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint32_t hash = static_cast<uint32_t>(i) * 2654435761u;
    values[i] = std::ldexp(hash & 1 ? -value : value, -static_cast<int>((hash >> 8) % binades));
  }
  return values;
}

// Runs the kernel and the probe alternately `reps` times (after one warm-up
// of each) and reports both medians.
json Report(const char* kernel, const KernelBenchOptions& o, double bytes_per_param,
            const std::function<double()>& run_kernel, const std::function<double()>& run_probe) {
  run_kernel();
  run_probe();
  std::vector<double> kernel_s, probe_s;
  for (int r = 0; r < o.reps; ++r) {
    kernel_s.push_back(run_kernel());
    probe_s.push_back(run_probe());
  }
  // Each kernel run is compared with the probe run next to it in time, so
  // that the machine's drift (other tenants) cancels: fraction_of_bound_paired.
  std::vector<double> fractions;
  for (int r = 0; r < o.reps; ++r) fractions.push_back(probe_s[r] / kernel_s[r]);
  double params_per_s = o.num_params / Median(kernel_s);
  double probe_GBps = o.num_params * bytes_per_param / Median(probe_s) / 1e9;
  double achieved_GBps = params_per_s * bytes_per_param / 1e9;
  return json{{"kernel", kernel},
              {"isa", IsaName(ActiveIsa())},
              {"params", o.num_params},
              {"threads", o.threads},
              {"grad", DTypeName(o.grad_dtype)},
              {"reps", o.reps},
              {"params_per_s", params_per_s},
              {"bytes_per_param", bytes_per_param},
              {"achieved_GBps", achieved_GBps},
              {"probe_GBps", probe_GBps},
              {"fraction_of_bound", achieved_GBps / probe_GBps},
              {"fraction_of_bound_paired", Median(fractions)},
              {"probe_isa", BestProbes()->isa}};
}

}  // namespace

absl::StatusOr<json> BenchAdam(const KernelBenchOptions& o) {
  if (absl::Status s = Validate(o); !s.ok()) return s;
  absl::StatusOr<StatePrecision> precision = StatePrecisionOf(o);
  if (!precision.ok()) return precision.status();
  const bool int8 = *precision == StatePrecision::kInt8;
  const size_t n = o.num_params;
  const size_t gsize = DTypeSize(o.grad_dtype);
  const DType copy_dtype = o.grad_dtype == DType::kBf16 ? DType::kBf16 : DType::kFp16;
  const size_t csize = DTypeSize(copy_dtype);
  const size_t state_bytes = int8 ? 1 : 4;
  const size_t blocks = Int8StateBlocks(n);
  ThreadPool pool(o.threads);
  auto p = AlignedBytes(n * 4), m = AlignedBytes(n * state_bytes),
       v = AlignedBytes(n * state_bytes);
  auto g = AlignedBytes(n * gsize), copy = AlignedBytes(n * csize);
  auto m_scale = AlignedBytes(int8 ? blocks * 4 : 0), v_scale = AlignedBytes(int8 ? blocks * 4 : 0);
  FillValue(pool, p.get(), DType::kFp32, n, 0.75f);
  Fill(pool, m.get(), n * state_bytes, 0);
  Fill(pool, v.get(), n * state_bytes, 0);
  if (o.grad_binades > 0) {
    FillValues(pool, g.get(), o.grad_dtype, n, SpreadGradients(1e-3f, o.grad_binades));
  } else {
    FillValue(pool, g.get(), o.grad_dtype, n, 1e-3f);
  }
  Fill(pool, copy.get(), n * csize, 0);
  if (int8) {
    Fill(pool, m_scale.get(), blocks * 4, 0);
    Fill(pool, v_scale.get(), blocks * 4, 0);
  }
  auto* pf = reinterpret_cast<float*>(p.get());
  int64_t step = 0;
  // Each moment's scales are read and written once a block.
  const double bytes_per_param = 4 + state_bytes * 2 + gsize + 4 + state_bytes * 2 + csize +
                                 (int8 ? 16.0 / kInt8StateBlock : 0);
  auto kernel = [&] {
    AdamConstants c =
        MakeAdamConstants(AdamConfig{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, true}, ++step, 1.0f);
    return TimeChunks(pool, n, [&](size_t b, size_t e) {
      if (int8) {
        const Int8Moments moments{
            m.get() + b, reinterpret_cast<float*>(m_scale.get()) + b / kInt8StateBlock, v.get() + b,
            reinterpret_cast<float*>(v_scale.get()) + b / kInt8StateBlock};
        AdamUpdateInt8(c, o.grad_dtype, g.get() + b * gsize, pf + b, moments,
                       Int8Rounding{Int8RoundingSeed(b >> 32, step), static_cast<uint32_t>(b)},
                       copy_dtype, copy.get() + b * csize, e - b);
      } else {
        AdamUpdate(c, o.grad_dtype, g.get() + b * gsize, pf + b,
                   reinterpret_cast<float*>(m.get()) + b, reinterpret_cast<float*>(v.get()) + b,
                   copy_dtype, copy.get() + b * csize, e - b);
      }
    });
  };
  // The kernel streams the copy of every chunk (aligned, >= 1 MiB): so does
  // the probe. It leaves out int8's scales (0.4% of its bytes).
  auto probe = [&] {
    return TimeChunks(pool, n, [&](size_t b, size_t e) {
      BestProbes()->adam_streams(pf + b, m.get() + b * state_bytes, v.get() + b * state_bytes,
                                 state_bytes, g.get() + b * gsize, gsize, copy.get() + b * csize,
                                 csize, /*stream_copy=*/true, e - b);
    });
  };
  json out = Report(int8 ? "adamw_int8" : "adamw", o, bytes_per_param, kernel, probe);
  out["state"] = o.state;
  out["grad_binades"] = o.grad_binades;
  return out;
}

absl::StatusOr<json> BenchGradStats(const KernelBenchOptions& o) {
  if (absl::Status s = Validate(o); !s.ok()) return s;
  const size_t n = o.num_params;
  const size_t gsize = DTypeSize(o.grad_dtype);
  ThreadPool pool(o.threads);
  auto g = AlignedBytes(n * gsize);
  FillValue(pool, g.get(), o.grad_dtype, n, 1e-3f);
  std::vector<double> sums((n + kBenchChunkElements - 1) / kBenchChunkElements);
  auto kernel = [&] {
    return TimeChunks(pool, n, [&](size_t b, size_t e) {
      sums[b / kBenchChunkElements] =
          ComputeGradStats(o.grad_dtype, g.get() + b * gsize, e - b).sum_squares;
    });
  };
  std::vector<uint64_t> sinks(sums.size());
  auto probe = [&] {
    return TimeChunks(pool, n, [&](size_t b, size_t e) {
      sinks[b / kBenchChunkElements] = BestProbes()->read(g.get() + b * gsize, gsize, e - b);
    });
  };
  return Report("grad_stats", o, static_cast<double>(gsize), kernel, probe);
}

absl::StatusOr<json> BenchCast(const KernelBenchOptions& o) {
  if (absl::Status s = Validate(o); !s.ok()) return s;
  if (o.grad_dtype == DType::kFp32) return absl::InvalidArgumentError("cast needs fp16 or bf16");
  const bool to_float = o.cast_op == "to_float";
  if (!to_float && o.cast_op != "from_float") {
    return absl::InvalidArgumentError("--op must be to_float or from_float");
  }
  const size_t n = o.num_params;
  const size_t lsize = DTypeSize(o.grad_dtype);
  ThreadPool pool(o.threads);
  auto f = AlignedBytes(n * 4), l = AlignedBytes(n * lsize);
  FillValue(pool, f.get(), DType::kFp32, n, 0.75f);
  FillValue(pool, l.get(), o.grad_dtype, n, 0.75f);
  auto* ff = reinterpret_cast<float*>(f.get());
  auto kernel = [&] {
    return TimeChunks(pool, n, [&](size_t b, size_t e) {
      if (to_float) {
        CastToFloat(o.grad_dtype, l.get() + b * lsize, ff + b, e - b);
      } else {
        CastFromFloat(ff + b, o.grad_dtype, l.get() + b * lsize, e - b);
      }
    });
  };
  // The bound is the faster of regular and streaming stores.
  auto probe = [&] {
    double best = 0;
    for (bool stream : {false, true}) {
      double s = TimeChunks(pool, n, [&](size_t b, size_t e) {
        if (to_float) {
          BestProbes()->read_write(l.get() + b * lsize, lsize, ff + b, 4, stream, e - b);
        } else {
          BestProbes()->read_write(ff + b, 4, l.get() + b * lsize, lsize, stream, e - b);
        }
      });
      best = best == 0 ? s : std::min(best, s);
    }
    return best;
  };
  json out = Report(to_float ? "cast_to_float" : "cast_from_float", o, 4.0 + lsize, kernel, probe);
  return out;
}

}  // namespace strata
