#include "tools/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace strata {
namespace {

absl::Status IoError(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, const void* data, size_t bytes, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return IoError("cannot write", path);
    p += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

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
  if (fd < 0) return IoError("cannot create", temporary);
  absl::Status status = WriteAll(fd, &header_bytes, sizeof(header_bytes), temporary);
  if (status.ok()) status = WriteAll(fd, text.data(), text.size(), temporary);
  for (const SafetensorsTensor& t : tensors) {
    if (!status.ok()) break;
    status = WriteAll(fd, t.data, NumElements(t.shape) * sizeof(float), temporary);
  }
  if (status.ok() && fsync(fd) != 0) status = IoError("cannot sync", temporary);
  close(fd);
  if (status.ok() && std::rename(temporary.c_str(), path.c_str()) != 0) {
    status = IoError("cannot rename to", path);
  }
  if (!status.ok()) std::remove(temporary.c_str());
  return status;
}

}  // namespace strata
