#include "core/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/file_io.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

uint64_t NumElements(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<SafetensorsTensor>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    if (header.contains(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor name '", t.name, "' appears twice"));
    }
    uint64_t bytes = NumElements(t.shape) * sizeof(float);
    header[t.name] = {
        {"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_bytes = text.size();  // little-endian on every target we build for
  const std::string temporary = path + ".tmp";
  int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", temporary);
  absl::Status status = WriteFully(fd, &header_bytes, sizeof(header_bytes), temporary);
  if (status.ok()) status = WriteFully(fd, text.data(), text.size(), temporary);
  for (const SafetensorsTensor& t : tensors) {
    if (!status.ok()) break;
    status = WriteFully(fd, t.data, NumElements(t.shape) * sizeof(float), temporary);
  }
  if (status.ok() && fsync(fd) != 0) status = ErrnoError("cannot sync", temporary);
  close(fd);
  if (status.ok() && std::rename(temporary.c_str(), path.c_str()) != 0) {
    status = ErrnoError("cannot rename to", path);
  }
  if (!status.ok()) std::remove(temporary.c_str());
  return status;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat("no file ", path));
    return ErrnoError("cannot open", path);
  }
  std::string bytes;
  char buffer[1 << 16];
  for (size_t n; (n = std::fread(buffer, 1, sizeof(buffer), f)) > 0;) bytes.append(buffer, n);
  bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return ErrnoError("cannot read", path);
  auto malformed = [&](const std::string& why) {
    return absl::DataLossError(absl::StrCat("safetensors file ", path, ": ", why));
  };
  uint64_t header_bytes = 0;
  if (bytes.size() < sizeof(header_bytes)) return malformed("shorter than its header size");
  std::memcpy(&header_bytes, bytes.data(), sizeof(header_bytes));
  if (header_bytes > bytes.size() - sizeof(header_bytes)) return malformed("truncated header");
  nlohmann::json header =
      nlohmann::json::parse(bytes.substr(sizeof(header_bytes), header_bytes), nullptr,
                            /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) return malformed("the header is not JSON");
  const uint64_t data_begin = sizeof(header_bytes) + header_bytes;
  const uint64_t data_bytes = bytes.size() - data_begin;
  SafetensorsFile file;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return malformed("__metadata__ is not an object");
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) return malformed(absl::StrCat("metadata '", key, "' is not text"));
        file.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") ||
        !entry.contains("data_offsets")) {
      return malformed(absl::StrCat("tensor '", name, "' lacks dtype, shape or data_offsets"));
    }
    if (entry["dtype"] != "F32") {
      return absl::InvalidArgumentError(absl::StrCat("safetensors file ", path, ": tensor '", name,
                                                     "' is ", entry["dtype"].dump(), ", not F32"));
    }
    SafetensorsFile::Tensor tensor;
    uint64_t elements = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) {
        return malformed(absl::StrCat("tensor '", name, "' has a bad shape"));
      }
      tensor.shape.push_back(d.get<int64_t>());
      elements *= d.get<uint64_t>();
    }
    const auto& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return malformed(absl::StrCat("tensor '", name, "' has bad data_offsets"));
    }
    uint64_t begin = offsets[0], end = offsets[1];
    if (begin > end || end > data_bytes || end - begin != elements * sizeof(float)) {
      return malformed(absl::StrCat("tensor '", name, "' has data_offsets [", begin, ", ", end,
                                    ") that do not fit its shape or the file"));
    }
    tensor.values.resize(elements);
    std::memcpy(tensor.values.data(), bytes.data() + data_begin + begin, end - begin);
    file.tensors[name] = std::move(tensor);
  }
  return file;
}

}  // namespace strata
