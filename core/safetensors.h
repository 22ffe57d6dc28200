// Writing and reading FP32 tensors in the safetensors format
// (https://huggingface.co/docs/safetensors), which PyTorch users load with
// `safetensors.torch.load_file`: an 8-byte little-endian header size, a JSON
// header giving each tensor's dtype, shape and byte range (and string
// metadata under "__metadata__"), padded with spaces to 8 bytes, then the data.
// Stateless.
#ifndef STRATA_CORE_SAFETENSORS_H_
#define STRATA_CORE_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata {

struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  const float* data;  // product(shape) values
};

// Writes `tensors` to `path` atomically (a synced temporary file renamed over
// it). INVALID_ARGUMENT for a duplicate name; the I/O error naming the file.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata);

struct SafetensorsFile {
  struct Tensor {
    std::vector<int64_t> shape;
    std::vector<float> values;
  };
  std::map<std::string, std::string> metadata;
  std::map<std::string, Tensor> tensors;
};

// Reads an F32 safetensors file. NOT_FOUND when it is missing; DATA_LOSS
// naming the file when its header is malformed or its sizes do not add up;
// INVALID_ARGUMENT for a tensor that is not F32.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);

}  // namespace strata

#endif  // STRATA_CORE_SAFETENSORS_H_
