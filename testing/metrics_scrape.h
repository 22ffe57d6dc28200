// Test helpers: a daemon's Prometheus endpoint read over plain HTTP, and
// one sample of what it exposes.
#ifndef STRATA_TESTING_METRICS_SCRAPE_H_
#define STRATA_TESTING_METRICS_SCRAPE_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace strata::testing {

// GET http://address/metrics; the body, or "" on failure.
inline std::string Scrape(const std::string& address) {
  std::vector<std::string> host_port = absl::StrSplit(address, ':');
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port[1])));
  inet_pton(AF_INET, host_port[0].c_str(), &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return "";
  }
  std::string request = "GET /metrics HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  if (write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
  close(fd);
  size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The value of the sample `series` (name and labels exactly as exposed), or -1.
inline double MetricValue(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, series + " ")) continue;
    double value;
    if (absl::SimpleAtod(line, &value)) return value;
  }
  return -1;
}

}  // namespace strata::testing

#endif  // STRATA_TESTING_METRICS_SCRAPE_H_
