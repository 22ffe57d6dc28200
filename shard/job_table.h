// The jobs a shard server holds. A ShardJob is one job here: its allocation
// record (the AllocateChunks request as the server holds it now: the chunks
// it has, the oldest generation it takes), dtype, chunks by flat begin, and
// what it reserved in the checkpoint arena. A JobTable finds them by id and
// by their worker token's digest; the functions below keep the records in
// the metadata store, where a restarted server finds its jobs.
// JobTable is thread-compatible (ShardService's mutex guards it); the record
// functions are thread-safe (the store is).
#ifndef STRATA_SHARD_JOB_TABLE_H_
#define STRATA_SHARD_JOB_TABLE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shard/chunk.h"
#include "storage/metadata_store.h"
#include "strata/types.h"
#include "strata/v1/shard.pb.h"

namespace strata {

struct ShardJob {
  v1::AllocateChunksRequest record;
  DType dtype = DType::kFp32;
  std::map<uint64_t, std::shared_ptr<Chunk>> chunks_by_begin;
  // What the job reserved in the checkpoint arena, given back when it goes.
  std::vector<uint64_t> checkpoint_pieces;
};

class JobTable {
 public:
  // Null when the job is not here; valid until the table changes.
  ShardJob* Find(const std::string& job_id) const;
  // The job whose record carries `digest` as its worker token's.
  std::optional<std::string> JobOfToken(absl::string_view digest) const;
  // Every job, in no order.
  std::vector<std::shared_ptr<ShardJob>> All() const;
  // Adds (or replaces) the job of `job->record`.
  void Add(std::shared_ptr<ShardJob> job);
  // Takes the job out; null when it is not here.
  std::shared_ptr<ShardJob> Remove(const std::string& job_id);

 private:
  absl::flat_hash_map<std::string, std::shared_ptr<ShardJob>> jobs_;
  absl::flat_hash_map<std::string, std::string> token_jobs_;
};

// Every job record in `metadata`, by job id; DATA_LOSS naming a record that
// does not parse.
absl::StatusOr<std::vector<v1::AllocateChunksRequest>> ReadJobRecords(MetadataStore* metadata);
// Writes (replaces) the record of `record`'s job.
absl::Status WriteJobRecord(MetadataStore* metadata, const v1::AllocateChunksRequest& record);
// The ids of the chunks an allocation makes anew for a seed
// (`seeded_chunk_ids`).
std::set<uint32_t> SeededChunkIds(const v1::AllocateChunksRequest& request);
// Deletes a job's record and its chunks' records (Chunk::RecordPrefix).
absl::Status DeleteJobRecords(MetadataStore* metadata, const std::string& job_id);

}  // namespace strata

#endif  // STRATA_SHARD_JOB_TABLE_H_
