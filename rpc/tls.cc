#include "rpc/tls.h"

#include <fstream>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/quoted.h"
#include "core/status_macros.h"
#include "rpc/token.h"

namespace strata {
namespace {

// PEM files (a chain, a key, a CA bundle) are far smaller than this.
constexpr std::streamsize kMaxPemBytes = 1 << 20;

// The contents of the PEM file of `flag`; INVALID_ARGUMENT naming it.
absl::StatusOr<std::string> ReadPem(const std::string& path, const char* flag) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat("TLS needs --", flag));
  std::ifstream in(path, std::ios::binary);
  std::string pem(kMaxPemBytes + 1, '\0');
  in.read(pem.data(), kMaxPemBytes + 1);
  if (in.bad() || !in.is_open()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", Quoted(path), " cannot be read"));
  }
  if (in.gcount() > kMaxPemBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", Quoted(path), " is over ", kMaxPemBytes, " bytes"));
  }
  pem.resize(in.gcount());
  if (pem.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " ", Quoted(path), " holds no PEM block"));
  }
  return pem;
}

// Adds `authorization: Bearer TOKEN` to every call of a channel.
class BearerToken final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerToken(const std::string& token) : value_(absl::StrCat(kBearerPrefix, token)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->emplace(kAuthorizationKey, value_);
    return grpc::Status::OK;
  }

 private:
  const std::string value_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files) {
  if (!files.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(files.ca_file, "tls_ca"));
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadPem(files.cert_file, "tls_cert"));
  ASSIGN_OR_RETURN(pair.private_key, ReadPem(files.key_file, "tls_key"));
  options.pem_key_cert_pairs.push_back(std::move(pair));
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<ChannelCredentials> MakeChannelCredentials(const TlsFiles& files,
                                                          const std::string& token) {
  if (!files.enabled()) {
    if (!token.empty()) {
      return absl::InvalidArgumentError(
          "a token is sent over TLS only: give the cluster's CA (--tls_ca, tls_ca_file)");
    }
    return PlaintextCredentials();
  }
  grpc::SslCredentialsOptions options;
  ASSIGN_OR_RETURN(options.pem_root_certs, ReadPem(files.ca_file, "tls_ca"));
  if (!files.cert_file.empty() || !files.key_file.empty()) {
    ASSIGN_OR_RETURN(options.pem_cert_chain, ReadPem(files.cert_file, "tls_cert"));
    ASSIGN_OR_RETURN(options.pem_private_key, ReadPem(files.key_file, "tls_key"));
  }
  ChannelCredentials tls = grpc::SslCredentials(options);
  if (token.empty()) return tls;
  RETURN_IF_ERROR(ValidateToken(token, "token"));
  return grpc::CompositeChannelCredentials(
      tls, grpc::MetadataCredentialsFromPlugin(std::make_unique<BearerToken>(token)));
}

ChannelCredentials PlaintextCredentials() { return grpc::InsecureChannelCredentials(); }

std::string DescribeTls(const TlsFiles& files) {
  if (!files.enabled()) {
    return "PLAINTEXT: no TLS, so anyone who reaches this port can read and change every job "
           "(use --tls_cert, --tls_key and --tls_ca beyond a local demo)";
  }
  return absl::StrCat("TLS with certificate ", files.cert_file, ", peers verified against ",
                      files.ca_file);
}

}  // namespace strata
