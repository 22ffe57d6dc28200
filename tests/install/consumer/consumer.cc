// Uses the installed public API: lays out a model, then connects to a
// coordinator that is not there and must get a clear error back.
#include <cstdio>

#include "strata/client.h"

int main() {
  auto layout = strata::FlatLayout::Create({{"w", {10, 10}}, {"b", {10}}}, 64);
  if (!layout.ok() || layout->num_params() != 138) return 1;
  strata::ClientOptions options;
  options.coordinator_address = "127.0.0.1:1";
  options.job_id = "consumer";
  options.job.tensors = {{"w", {10, 10}}};
  options.job.chunk_num_params = 64;
  options.rendezvous_timeout = absl::Seconds(1);
  auto client = strata::Client::Connect(options);
  if (client.ok()) return 1;
  std::printf("consumer: layout of %llu params; connect refused as expected: %s\n",
              static_cast<unsigned long long>(layout->num_params()),
              client.status().ToString().c_str());
  return 0;
}
