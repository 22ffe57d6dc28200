#include "coordinator/placement.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/job_info.h"
#include "core/chunk_bytes.h"
#include "rpc/job_spec.h"

namespace strata {
namespace {

uint64_t ChunkBytesOf(const v1::ChunkSpec& chunk, const v1::JobSpec& spec) {
  return ChunkBytes(chunk.num_params(), DTypeFromProto(spec.dtype()).value_or(DType::kFp32),
                    StatePrecisionOf(spec));
}

// The bytes each live server can still take: its capacity less the chunks
// placed on it; and each one's failure domain.
class FreeBytes {
 public:
  // Counts every copy in `placed` except those of the job `job_id`.
  FreeBytes(const std::vector<v1::ServerRecord>& live,
            const std::vector<const v1::JobInfo*>& placed, const std::string& job_id) {
    for (const v1::ServerRecord& server : live) {
      free_[server.address()] = capacity_[server.address()] = ServerCapacityBytes(server);
      if (!server.zone().empty()) zone_[server.address()] = server.zone();
    }
    for (const v1::JobInfo* other : placed) {
      if (other->spec().job_id() != job_id) Take(*other);
    }
  }
  // Takes every copy of `job`'s chunks.
  void Take(const v1::JobInfo& job) {
    for (const auto& c : job.chunks()) {
      const uint64_t bytes = ChunkBytesOf(c.chunk(), job.spec());
      for (const std::string& address : CopiesOf(c)) Take(address, bytes);
    }
  }
  void Take(const std::string& address, uint64_t bytes) {
    auto it = free_.find(address);
    if (it != free_.end()) it->second -= std::min(it->second, bytes);
  }
  void Give(const std::string& address, uint64_t bytes) {
    auto it = free_.find(address);
    if (it != free_.end()) it->second = std::min(it->second + bytes, capacity_[address]);
  }
  // The share of the server's capacity that is free.
  double Share(const std::string& address) const {
    return static_cast<double>(free_.at(address)) / std::max<uint64_t>(capacity_.at(address), 1);
  }
  // Of the live servers that `bytes` fit on and that hold no copy of `a`,
  // one in a zone that holds none either where there is one, and of those
  // the one with the largest free share (the smallest address on a tie);
  // empty when none.
  std::string Best(const v1::ChunkAssignment& a, uint64_t bytes) const {
    std::set<std::string> zones_taken;
    for (const std::string& address : CopiesOf(a)) zones_taken.insert(Zone(address));
    std::string best;
    bool best_in_new_zone = false;
    for (const auto& [address, bytes_free] : free_) {
      if (bytes_free < bytes || HoldsCopy(a, address)) continue;
      const bool in_new_zone = zones_taken.count(Zone(address)) == 0;
      if (best.empty() || in_new_zone > best_in_new_zone ||
          (in_new_zone == best_in_new_zone && Share(address) > Share(best))) {
        best = address;
        best_in_new_zone = in_new_zone;
      }
    }
    return best;
  }
  // The failure domain of the server at `address`: its zone, or the server
  // alone when it names none (or is not live).
  std::string Zone(const std::string& address) const {
    auto it = zone_.find(address);
    return it == zone_.end() ? "server " + address : "zone " + it->second;
  }
  // How many distinct zones the servers `addresses` are in.
  size_t ZonesOf(const std::vector<std::string>& addresses) const {
    std::set<std::string> zones;
    for (const std::string& address : addresses) zones.insert(Zone(address));
    return zones.size();
  }
  const std::map<std::string, uint64_t>& free() const { return free_; }
  uint64_t capacity(const std::string& address) const { return capacity_.at(address); }

 private:
  std::map<std::string, uint64_t> free_, capacity_;
  std::map<std::string, std::string> zone_;  // of the live servers that name one
};

// Makes `copies` the copies of `a`, the first its primary (none when empty).
void SetCopies(const std::vector<std::string>& copies, v1::ChunkAssignment* a) {
  a->set_server_address(copies.empty() ? "" : copies.front());
  a->mutable_replica_addresses()->Assign(copies.begin() + (copies.empty() ? 0 : 1), copies.end());
}

// Adds `address` as a copy of `a`: its primary when it has none.
void AddCopy(const std::string& address, v1::ChunkAssignment* a) {
  if (a->server_address().empty()) {
    a->set_server_address(address);
  } else {
    a->add_replica_addresses(address);
  }
}

}  // namespace

uint64_t ServerCapacityBytes(const v1::ServerRecord& server) {
  return server.gpu_budget_bytes() + server.host_budget_bytes() + server.nvme_budget_bytes();
}

absl::Status PlaceChunks(const std::vector<v1::ServerRecord>& live,
                         const std::vector<const v1::JobInfo*>& placed, v1::JobInfo* job) {
  const v1::JobSpec& spec = job->spec();
  if (live.empty()) return absl::FailedPreconditionError("no live shard servers are registered");
  FreeBytes free(live, placed, spec.job_id());
  const uint32_t copies = std::max<uint32_t>(spec.replicas(), 1);
  if (copies > live.size()) {
    return absl::FailedPreconditionError(absl::StrCat("job '", spec.job_id(), "' wants ", copies,
                                                      " copies of each chunk on distinct "
                                                      "shard servers; ",
                                                      live.size(),
                                                      " live server(s) are registered"));
  }
  uint64_t job_bytes = 0;
  std::map<std::string, uint64_t> primary_bytes;  // the job's, per server
  for (v1::ChunkAssignment& a : *job->mutable_chunks()) {
    a.clear_server_address();
    a.clear_replica_addresses();
    const uint64_t bytes = ChunkBytesOf(a.chunk(), spec);
    for (uint32_t copy = 0; copy < copies; ++copy) {
      job_bytes += bytes;
      const std::string best = free.Best(a, bytes);
      if (best.empty()) {
        uint64_t total_free = 0;
        for (const auto& [address, bytes_free] : free.free()) total_free += bytes_free;
        return absl::ResourceExhaustedError(absl::StrCat(
            "job '", spec.job_id(), "' does not fit: it needs ", job->flat_num_params(),
            " params, at least ", job_bytes, " bytes so far of chunks of ", bytes, " bytes; the ",
            live.size(), " live shard server(s) have ", total_free, " bytes free in all"));
      }
      free.Take(best, bytes);
      AddCopy(best, &a);
    }
    // The copy on the server with the fewest of the job's primary bytes so
    // far serves the pulls (the first chosen on a tie).
    for (std::string& replica : *a.mutable_replica_addresses()) {
      if (primary_bytes[replica] < primary_bytes[a.server_address()]) {
        std::string primary = a.server_address();
        a.set_server_address(replica);
        replica = std::move(primary);
      }
    }
    primary_bytes[a.server_address()] += bytes;
  }
  return absl::OkStatus();
}

void RemoveCopies(const std::set<std::string>& gone, v1::JobInfo* job) {
  for (v1::ChunkAssignment& a : *job->mutable_chunks()) {
    std::vector<std::string> kept;
    for (std::string& address : CopiesOf(a)) {
      if (!address.empty() && gone.count(address) == 0) kept.push_back(std::move(address));
    }
    SetCopies(kept, &a);
  }
}

int AddMissingCopies(const std::vector<v1::ServerRecord>& live,
                     const std::vector<const v1::JobInfo*>& placed, v1::JobInfo* job) {
  FreeBytes free(live, placed, job->spec().job_id());
  free.Take(*job);
  const int copies = static_cast<int>(std::max<uint32_t>(job->spec().replicas(), 1));
  int added = 0;
  for (v1::ChunkAssignment& a : *job->mutable_chunks()) {
    const uint64_t bytes = ChunkBytesOf(a.chunk(), job->spec());
    int have = a.server_address().empty() ? 0 : 1 + a.replica_addresses_size();
    for (; have < copies; ++have) {
      const std::string best = free.Best(a, bytes);
      if (best.empty()) break;
      free.Take(best, bytes);
      AddCopy(best, &a);
      ++added;
    }
  }
  return added;
}

int RebalanceCopies(const std::vector<v1::ServerRecord>& live,
                    const std::vector<const v1::JobInfo*>& placed, v1::JobInfo* job) {
  FreeBytes free(live, placed, job->spec().job_id());
  free.Take(*job);
  int moved = 0;
  // Each move lowers the spread of the used shares; bounded all the same.
  const int max_moves = job->chunks_size() * static_cast<int>(live.size());
  while (moved < max_moves) {
    // The emptiest live server by share of capacity free takes a copy from
    // the fullest that holds a chunk it lacks.
    std::string emptiest;
    for (const auto& [address, bytes_free] : free.free()) {
      if (emptiest.empty() || free.Share(address) > free.Share(emptiest)) emptiest = address;
    }
    std::string fullest;
    v1::ChunkAssignment* move = nullptr;
    for (v1::ChunkAssignment& a : *job->mutable_chunks()) {
      if (HoldsCopy(a, emptiest)) continue;
      const std::vector<std::string> copies = CopiesOf(a);
      for (const std::string& address : copies) {
        if (free.free().count(address) == 0 ||
            (!fullest.empty() && free.Share(address) >= free.Share(fullest))) {
          continue;
        }
        // No move puts a chunk's copies in fewer zones.
        std::vector<std::string> after = copies;
        *std::find(after.begin(), after.end(), address) = emptiest;
        if (free.ZonesOf(after) < free.ZonesOf(copies)) continue;
        fullest = address;
        move = &a;
      }
    }
    if (move == nullptr) break;
    const uint64_t bytes = ChunkBytesOf(move->chunk(), job->spec());
    // Worth it while the receiver stays less full than the giver was.
    if (free.free().at(emptiest) < bytes) break;
    const double receiver_share_after = static_cast<double>(free.free().at(emptiest) - bytes) /
                                        std::max<uint64_t>(free.capacity(emptiest), 1);
    if (receiver_share_after <= free.Share(fullest)) break;
    // A primary's place goes to the chunk's first replica, when it has one.
    std::vector<std::string> copies = CopiesOf(*move);
    copies.erase(std::find(copies.begin(), copies.end(), fullest));
    copies.push_back(emptiest);
    SetCopies(copies, move);
    free.Give(fullest, bytes);
    free.Take(emptiest, bytes);
    ++moved;
  }
  return moved;
}

}  // namespace strata
