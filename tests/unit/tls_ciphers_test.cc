// PreferAes128Gcm: contexts OpenSSL makes afterwards offer
// TLS_AES_128_GCM_SHA256 first and pick by their own order as servers;
// the system configuration's settings stay, its own Ciphersuites among
// them; one it cannot carry over leaves OpenSSL as it was. Each case runs
// in a child process (OpenSSL loads its configuration once per process),
// with OPENSSL_CONF naming a configuration written for it.
#include "rpc/tls_ciphers.h"

#include <openssl/ssl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <string>

#include "gtest/gtest.h"
#include "testing/scratch_dir.h"

namespace strata {
namespace {

// What a context made now has.
struct NewContext {
  bool server_preference = false;
  std::string first_suite;
  int min_version = 0;
};
NewContext MakeContext() {
  NewContext out;
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) return out;
  out.server_preference = (SSL_CTX_get_options(ctx) & SSL_OP_CIPHER_SERVER_PREFERENCE) != 0;
  STACK_OF(SSL_CIPHER)* ciphers = SSL_CTX_get_ciphers(ctx);
  if (ciphers != nullptr && sk_SSL_CIPHER_num(ciphers) > 0) {
    out.first_suite = SSL_CIPHER_get_name(sk_SSL_CIPHER_value(ciphers, 0));
  }
  out.min_version = static_cast<int>(SSL_CTX_get_min_proto_version(ctx));
  SSL_CTX_free(ctx);
  return out;
}

// The system configuration whose ssl_conf system_default section holds
// `settings` (one "name = value" a line).
std::string SystemConfiguration(const std::string& settings) {
  return "openssl_conf = init\n[init]\nssl_conf = ssl\n[ssl]\nsystem_default = tls\n[tls]\n" +
         settings;
}

// Runs `check` in a child process (a death test) whose OPENSSL_CONF holds
// `configuration`; it must return true. Its complaints go to stderr, which
// a failure shows.
void ExpectInChild(const std::string& configuration, const std::function<bool()>& check) {
  testing::ScratchDir dir("tls_ciphers");
  const std::string path = dir.path() + "/openssl.cnf";
  std::ofstream(path) << configuration;
  EXPECT_EXIT(
      {
        setenv("OPENSSL_CONF", path.c_str(), 1);
        _exit(check() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(TlsCiphersDeathTest, NewContextsPreferAes128GcmAndKeepTheSystemsSettings) {
  ExpectInChild(SystemConfiguration("MinProtocol = TLSv1.3\n"), [] {
    const NewContext before = MakeContext();
    if (before.first_suite != "TLS_AES_256_GCM_SHA384" || before.server_preference) {
      fprintf(stderr, "OpenSSL's default: %s first, server preference %d\n",
              before.first_suite.c_str(), before.server_preference);
      return false;
    }
    const absl::Status preferred = PreferAes128Gcm();
    const NewContext after = MakeContext();
    fprintf(stderr, "%s; %s first, server preference %d, min version %x\n",
            preferred.ToString().c_str(), after.first_suite.c_str(), after.server_preference,
            after.min_version);
    return preferred.ok() && after.first_suite == "TLS_AES_128_GCM_SHA256" &&
           after.server_preference && after.min_version == TLS1_3_VERSION;
  });
}

TEST(TlsCiphersDeathTest, TheSystemsOwnSuitesStay) {
  ExpectInChild(SystemConfiguration(
                    "Ciphersuites = TLS_CHACHA20_POLY1305_SHA256\nOptions = NoRenegotiation\n"),
                [] {
                  const absl::Status preferred = PreferAes128Gcm();
                  const NewContext after = MakeContext();
                  fprintf(stderr, "%s; %s first, server preference %d\n",
                          preferred.ToString().c_str(), after.first_suite.c_str(),
                          after.server_preference);
                  return preferred.ok() && after.first_suite == "TLS_CHACHA20_POLY1305_SHA256" &&
                         after.server_preference;
                });
}

TEST(TlsCiphersDeathTest, ASettingItCannotCarryOverLeavesOpenSslAsItWas) {
  ExpectInChild(SystemConfiguration("CipherString = HIGH !aNULL\n"), [] {
    const absl::Status preferred = PreferAes128Gcm();
    const NewContext after = MakeContext();
    fprintf(stderr, "%s; %s first, server preference %d\n", preferred.ToString().c_str(),
            after.first_suite.c_str(), after.server_preference);
    return absl::IsFailedPrecondition(preferred) &&
           preferred.message().find("CipherString") != std::string::npos &&
           after.first_suite == "TLS_AES_256_GCM_SHA384" && !after.server_preference;
  });
}

TEST(TlsCiphersDeathTest, WithoutAnSslSectionTheDefaultsGetThePreference) {
  ExpectInChild("openssl_conf = init\n[init]\n", [] {
    const absl::Status preferred = PreferAes128Gcm();
    const NewContext after = MakeContext();
    return preferred.ok() && after.first_suite == "TLS_AES_128_GCM_SHA256" &&
           after.server_preference;
  });
}

}  // namespace
}  // namespace strata
