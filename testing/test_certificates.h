// TestCertificates: a throw-away CA and certificates made with the openssl
// command in a directory, for tests of TLS: ca.pem signs coordinator.pem,
// server.pem and client.pem (each with its .key; names 127.0.0.1 and
// localhost); other-ca.pem signs other-client.pem, a certificate the first
// CA does not know. Not thread-safe.
#ifndef STRATA_TESTING_TEST_CERTIFICATES_H_
#define STRATA_TESTING_TEST_CERTIFICATES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "rpc/tls.h"
#include "testing/processes.h"

namespace strata::testing {

class TestCertificates {
 public:
  explicit TestCertificates(std::string dir) : dir_(std::move(dir)) {}

  // Makes every file (and the directory, if missing); the openssl output on
  // failure.
  absl::Status Make() {
    std::string script = absl::StrCat("set -e; mkdir -p '", dir_, "'; cd '", dir_, "'; ");
    absl::StrAppend(&script, Ca("ca"), Ca("other-ca"));
    for (const char* name : {"coordinator", "server", "client"}) {
      absl::StrAppend(&script, Leaf(name, "ca"));
    }
    absl::StrAppend(&script, Leaf("other-client", "other-ca"));
    auto [status, output] = RunCommand(script);
    if (status != 0) return absl::InternalError(absl::StrCat("openssl failed: ", output));
    return absl::OkStatus();
  }

  // The files of certificate `name` (with ca.pem as the CA).
  TlsFiles Files(const std::string& name, const std::string& ca = "ca") const {
    return TlsFiles{absl::StrCat(dir_, "/", name, ".pem"), absl::StrCat(dir_, "/", name, ".key"),
                    absl::StrCat(dir_, "/", ca, ".pem")};
  }

 private:
  static std::string Ca(const std::string& name) {
    return absl::StrCat("openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes ",
                        "-keyout ", name, ".key -out ", name, ".pem -days 2 -subj /CN=", name,
                        " 2>&1; ");
  }
  static std::string Leaf(const std::string& name, const std::string& ca) {
    return absl::StrCat("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ",
                        name, ".key -out ", name, ".csr -subj /CN=strata-", name, " 2>&1; ",
                        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > ", name, ".ext; ",
                        "openssl x509 -req -in ", name, ".csr -CA ", ca, ".pem -CAkey ", ca,
                        ".key -CAcreateserial -days 2 -extfile ", name, ".ext -out ", name,
                        ".pem 2>&1; ");
  }

  const std::string dir_;
};

}  // namespace strata::testing

#endif  // STRATA_TESTING_TEST_CERTIFICATES_H_
