// Job specs for tests that speak to the coordinator or a shard server
// directly: one tensor "w" and Adam's usual constants. Values; no state.
#ifndef STRATA_TESTING_JOB_SPEC_H_
#define STRATA_TESTING_JOB_SPEC_H_

#include <cstdint>
#include <string>

#include "strata/v1/common.pb.h"

namespace strata {
namespace testing {

// Job `job_id`: one tensor "w" of `num_params` in chunks of
// `chunk_num_params`, in `dtype`, for `world_size` workers with `replicas`
// copies of each chunk (0: the default, one); lr 1e-3, betas (0.9, 0.999),
// eps 1e-8.
inline v1::JobSpec OneTensorSpec(const std::string& job_id, uint64_t num_params,
                                 uint64_t chunk_num_params, v1::DType dtype,
                                 uint32_t world_size = 1, uint32_t replicas = 0) {
  v1::JobSpec spec;
  spec.set_job_id(job_id);
  v1::TensorSpec* tensor = spec.add_tensors();
  tensor->set_name("w");
  tensor->add_shape(num_params);
  spec.set_world_size(world_size);
  spec.set_chunk_num_params(chunk_num_params);
  spec.set_dtype(dtype);
  spec.set_replicas(replicas);
  spec.mutable_adam()->set_lr(1e-3f);
  spec.mutable_adam()->set_beta1(0.9f);
  spec.mutable_adam()->set_beta2(0.999f);
  spec.mutable_adam()->set_eps(1e-8f);
  return spec;
}

}  // namespace testing
}  // namespace strata

#endif  // STRATA_TESTING_JOB_SPEC_H_
