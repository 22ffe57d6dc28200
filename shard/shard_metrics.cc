// ShardService's Prometheus metrics (shard_service.h).
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "shard/shard_service.h"

namespace strata {

void ShardService::ExportMetrics(Metrics* metrics) {
  prometheus::Registry& registry = metrics->registry();
  pushed_bytes_ = &prometheus::BuildCounter()
                       .Name("strata_pushed_bytes_total")
                       .Help("Gradient bytes received in pushes")
                       .Register(registry)
                       .Add({});
  pulled_bytes_ = &prometheus::BuildCounter()
                       .Name("strata_pulled_bytes_total")
                       .Help("Parameter bytes sent in pulls")
                       .Register(registry)
                       .Add({});
  apply_seconds_ = &prometheus::BuildHistogram()
                        .Name("strata_chunk_apply_seconds")
                        .Help("Time to apply one step to one chunk (load, AdamW, commit)")
                        .Register(registry)
                        .Add({}, prometheus::Histogram::BucketBoundaries{1e-4, 1e-3, 3e-3, 1e-2,
                                                                         3e-2, 0.1, 0.3, 1, 3});
  collected_ = std::make_shared<CollectFunction>([this] {
    std::map<std::string, std::pair<uint64_t, uint64_t>> per_tier;  // chunks, bytes
    {
      absl::MutexLock lock(&mu_);
      for (const std::shared_ptr<ShardJob>& job : jobs_.All()) {
        for (const auto& [begin, chunk] : job->chunks_by_begin) {
          auto& [chunks, bytes] = per_tier[TierKindName(chunk->tier())];
          ++chunks;
          bytes += chunk->num_bytes();
        }
      }
    }
    std::vector<std::pair<prometheus::Labels, double>> budget, used, kept, chunks, io;
    for (Tier* tier : Tiers()) {
      std::string name = TierKindName(tier->kind());
      budget.push_back({{{"tier", name}}, static_cast<double>(tier->budget_bytes())});
      used.push_back({{{"tier", name}}, static_cast<double>(tier->used_bytes())});
      kept.push_back({{{"tier", name}}, static_cast<double>(tier->kept_bytes())});
      chunks.push_back({{{"tier", name}}, static_cast<double>(per_tier[name].first)});
    }
    if (nvme_ != nullptr) {
      io.push_back({{{"tier", "nvme"}, {"op", "read"}}, static_cast<double>(nvme_->read_bytes())});
      io.push_back(
          {{{"tier", "nvme"}, {"op", "write"}}, static_cast<double>(nvme_->written_bytes())});
    }
    using prometheus::MetricType;
    return std::vector<prometheus::MetricFamily>{
        ValueFamily(MetricType::Gauge, "strata_tier_budget_bytes", "Byte budget of each tier",
                    budget),
        ValueFamily(MetricType::Gauge, "strata_tier_used_bytes", "Bytes allocated in each tier",
                    used),
        ValueFamily(MetricType::Gauge, "strata_tier_kept_bytes",
                    "Memory each tier keeps for new extents: freed extents' and memory faulted "
                    "in ahead (resident, within the budget with the bytes allocated)",
                    kept),
        ValueFamily(MetricType::Gauge, "strata_tier_chunks",
                    "Chunks whose state lives in each tier", chunks),
        ValueFamily(MetricType::Counter, "strata_tier_io_bytes_total",
                    "Bytes moved by tier I/O (rate() gives the bandwidth)", io),
        ValueFamily(
            MetricType::Gauge, "strata_checkpoint_memory_bytes",
            "Host memory for chunk states that checkpoints keep aside: held now "
            "(kept region, pieces out and kept), out now, what the jobs' saves take "
            "(reserved), and the limit",
            {{{{"kind", "held"}}, static_cast<double>(checkpoint_arena_->held_bytes())},
             {{{"kind", "reserved"}}, static_cast<double>(checkpoint_arena_->reserved_bytes())},
             {{{"kind", "taken"}}, static_cast<double>(checkpoint_arena_->taken_bytes())},
             {{{"kind", "limit"}}, static_cast<double>(checkpoint_arena_->limit_bytes())}}),
        ValueFamily(MetricType::Counter, "strata_checkpoint_memory_refused_bytes_total",
                    "Checkpoint memory refused for the limit: those chunks' states were written "
                    "by training steps",
                    {{{}, static_cast<double>(checkpoint_arena_->refused_bytes())}})};
  });
  metrics->Register(collected_);
}

}  // namespace strata
