// What the coordinator reads off a v1::JobInfo: which shard servers hold its
// chunks (every copy: the primary and the replicas), and which chunks each
// holds; and the error for a job it does not have. Stateless.
#ifndef STRATA_COORDINATOR_JOB_INFO_H_
#define STRATA_COORDINATOR_JOB_INFO_H_

#include <algorithm>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/quoted.h"
#include "strata/v1/coordinator.pb.h"

namespace strata {

// NOT_FOUND for a job the coordinator does not have.
inline absl::Status UnknownJob(const std::string& job_id) {
  return absl::NotFoundError(absl::StrCat("unknown job ", Quoted(job_id)));
}

// The servers of the chunk's copies, the primary first.
inline std::vector<std::string> CopiesOf(const v1::ChunkAssignment& c) {
  std::vector<std::string> addresses = {c.server_address()};
  addresses.insert(addresses.end(), c.replica_addresses().begin(), c.replica_addresses().end());
  return addresses;
}

// Whether the server at `address` holds a copy of the chunk.
inline bool HoldsCopy(const v1::ChunkAssignment& c, const std::string& address) {
  return c.server_address() == address ||
         std::find(c.replica_addresses().begin(), c.replica_addresses().end(), address) !=
             c.replica_addresses().end();
}

// The distinct addresses of the job's servers, sorted.
inline std::vector<std::string> ServersOf(const v1::JobInfo& job) {
  std::vector<std::string> addresses;
  for (const auto& c : job.chunks()) {
    addresses.push_back(c.server_address());
    addresses.insert(addresses.end(), c.replica_addresses().begin(), c.replica_addresses().end());
  }
  std::sort(addresses.begin(), addresses.end());
  addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
  return addresses;
}

// Whether the server at `address` holds any of the job's chunks.
inline bool HasChunksOn(const v1::JobInfo& job, const std::string& address) {
  return std::any_of(job.chunks().begin(), job.chunks().end(),
                     [&](const v1::ChunkAssignment& c) { return HoldsCopy(c, address); });
}

// The ids of the job's chunks whose primary copy is on the server at
// `address` (those it saves in a checkpoint).
inline std::vector<uint32_t> PrimariesOn(const v1::JobInfo& job, const std::string& address) {
  std::vector<uint32_t> ids;
  for (const auto& c : job.chunks()) {
    if (c.server_address() == address) ids.push_back(c.chunk().chunk_id());
  }
  return ids;
}

// The ids of the job's chunks with a copy other than the primary on the
// server at `address`.
inline std::vector<uint32_t> ReplicasOn(const v1::JobInfo& job, const std::string& address) {
  std::vector<uint32_t> ids;
  for (const auto& c : job.chunks()) {
    if (c.server_address() != address && HoldsCopy(c, address)) ids.push_back(c.chunk().chunk_id());
  }
  return ids;
}

// The servers of the chunks' primary copies, sorted.
inline std::vector<std::string> PrimaryServersOf(const v1::JobInfo& job) {
  std::vector<std::string> addresses;
  for (const auto& c : job.chunks()) addresses.push_back(c.server_address());
  std::sort(addresses.begin(), addresses.end());
  addresses.erase(std::unique(addresses.begin(), addresses.end()), addresses.end());
  return addresses;
}

// The job's chunks on the server at `address` (any copy).
inline std::vector<v1::ChunkSpec> ChunksOn(const v1::JobInfo& job, const std::string& address) {
  std::vector<v1::ChunkSpec> chunks;
  for (const auto& c : job.chunks()) {
    if (HoldsCopy(c, address)) chunks.push_back(c.chunk());
  }
  return chunks;
}

}  // namespace strata

#endif  // STRATA_COORDINATOR_JOB_INFO_H_
