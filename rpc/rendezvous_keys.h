// The keys of the coordinator's rendezvous store (KvSet/KvGet) that belong to
// a job: every key a job's workers set starts with RendezvousPrefix(job_id),
// and the coordinator deletes those keys with the job. Stateless.
#ifndef STRATA_RPC_RENDEZVOUS_KEYS_H_
#define STRATA_RPC_RENDEZVOUS_KEYS_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace strata {

// What every job's rendezvous keys start with.
inline constexpr absl::string_view kRendezvousJobsPrefix = "job/";

// "job/<job_id>/": the prefix of every rendezvous key of the job.
inline std::string RendezvousPrefix(const std::string& job_id) {
  return absl::StrCat(kRendezvousJobsPrefix, job_id, "/");
}

// The prefix of the keys a generation's workers form their group under.
inline std::string GenerationRendezvousPrefix(const std::string& job_id, uint64_t generation) {
  return absl::StrCat(RendezvousPrefix(job_id), "generation-", generation, "/");
}

// The job a rendezvous key belongs to: "a" for "job/a/x"; empty for a key
// outside every job's prefix.
inline std::string JobOfRendezvousKey(absl::string_view key) {
  if (!absl::ConsumePrefix(&key, kRendezvousJobsPrefix)) return "";
  const size_t end = key.find('/');
  if (end == absl::string_view::npos) return "";
  return std::string(key.substr(0, end));
}

}  // namespace strata

#endif  // STRATA_RPC_RENDEZVOUS_KEYS_H_
