#include "rpc/tls_ciphers.h"

#include <openssl/bio.h>
#include <openssl/conf.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <strings.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/log.h"
#include "core/status_macros.h"

namespace strata {
namespace {

using Setting = std::pair<std::string, std::string>;

struct ConfDeleter {
  void operator()(CONF* conf) const { NCONF_free(conf); }
};
using ConfPtr = std::unique_ptr<CONF, ConfDeleter>;

// The value of `name` in `section` of `conf` (nullptr: the default
// section), or nullptr; a missing one leaves nothing on OpenSSL's error
// queue.
const char* Lookup(const CONF* conf, const char* section, const char* name) {
  const char* value = NCONF_get_string(conf, section, name);
  if (value == nullptr) ERR_clear_error();
  return value;
}

// The settings of the `system_default` section of the `ssl_conf` of the
// configuration file OpenSSL loads (OPENSSL_CONF, else its default); none
// when there is no such file or section.
std::vector<Setting> SystemDefaultSettings() {
  std::vector<Setting> settings;
  char* path = CONF_get1_default_config_file();
  if (path == nullptr) return settings;
  ConfPtr conf(NCONF_new(nullptr));
  long error_line = 0;
  const bool loaded = conf != nullptr && NCONF_load(conf.get(), path, &error_line) > 0;
  OPENSSL_free(path);
  if (!loaded) {
    ERR_clear_error();
    return settings;
  }
  const char* init = Lookup(conf.get(), nullptr, "openssl_conf");
  const char* ssl = init == nullptr ? nullptr : Lookup(conf.get(), init, "ssl_conf");
  const char* tls = ssl == nullptr ? nullptr : Lookup(conf.get(), ssl, "system_default");
  STACK_OF(CONF_VALUE)* values = tls == nullptr ? nullptr : NCONF_get_section(conf.get(), tls);
  for (int i = 0; values != nullptr && i < sk_CONF_VALUE_num(values); ++i) {
    const CONF_VALUE* v = sk_CONF_VALUE_value(values, i);
    settings.emplace_back(v->name, v->value);
  }
  ERR_clear_error();
  return settings;
}

// Whether `text` can be written back as a configuration name or value as
// it is (no quoting, comment, variable or escape characters).
bool Plain(const std::string& text) {
  if (text.empty()) return false;
  for (char c : text) {
    const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                       std::string_view("_.:,@=+-/!").find(c) != std::string_view::npos;
    if (!plain) return false;
  }
  return true;
}

// Whether `settings` set `name` (as OpenSSL reads names: in any case).
bool Sets(const std::vector<Setting>& settings, const char* name) {
  for (const auto& setting : settings) {
    if (strcasecmp(setting.first.c_str(), name) == 0) return true;
  }
  return false;
}

// `system` with Ciphersuites (unless it names some) and ServerPreference
// added, as an OpenSSL configuration whose `strata_tls` names it.
absl::StatusOr<std::string> Configuration(const std::vector<Setting>& system) {
  std::string section;
  for (const auto& [name, value] : system) {
    if (!Plain(name) || !Plain(value)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the system's OpenSSL setting ", name, " is not plain text that can be carried over"));
    }
    const bool options = strcasecmp(name.c_str(), "Options") == 0;
    absl::StrAppend(&section, name, " = ", value, options ? ",ServerPreference" : "", "\n");
  }
  if (!Sets(system, "Ciphersuites")) {
    absl::StrAppend(&section, "Ciphersuites = ", kAes128GcmFirst, "\n");
  }
  if (!Sets(system, "Options")) absl::StrAppend(&section, "Options = ServerPreference\n");
  return absl::StrCat(
      "strata_tls = strata_tls_init\n"
      "[strata_tls_init]\nssl_conf = strata_tls_ssl\n"
      "[strata_tls_ssl]\nsystem_default = strata_tls_default\n"
      "[strata_tls_default]\n",
      section);
}

// OpenSSL's queued errors as text (and the queue emptied).
std::string OpenSslErrors() {
  std::string errors;
  for (unsigned long e = ERR_get_error(); e != 0; e = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(e, text, sizeof(text));
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", text);
  }
  return errors.empty() ? "no error queued" : errors;
}

// Checks what a context made now gets: server preference and, where the
// system names no suites of its own, TLS_AES_128_GCM_SHA256 first.
absl::Status CheckNewContext(bool system_names_suites) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) return absl::InternalError(absl::StrCat("SSL_CTX_new: ", OpenSslErrors()));
  const bool server_preference = (SSL_CTX_get_options(ctx) & SSL_OP_CIPHER_SERVER_PREFERENCE) != 0;
  STACK_OF(SSL_CIPHER)* ciphers = SSL_CTX_get_ciphers(ctx);
  const std::string first = ciphers != nullptr && sk_SSL_CIPHER_num(ciphers) > 0
                                ? SSL_CIPHER_get_name(sk_SSL_CIPHER_value(ciphers, 0))
                                : "none";
  SSL_CTX_free(ctx);
  if (!server_preference) {
    return absl::InternalError("OpenSSL contexts did not take ServerPreference");
  }
  if (!system_names_suites && first != "TLS_AES_128_GCM_SHA256") {
    return absl::InternalError(
        absl::StrCat("OpenSSL contexts offer ", first, " first, not TLS_AES_128_GCM_SHA256"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PreferAes128Gcm() {
  // The system's configuration first: the one loaded below replaces its
  // ssl_conf, not the other way round.
  if (OPENSSL_init_ssl(OPENSSL_INIT_LOAD_CONFIG, nullptr) != 1) {
    return absl::InternalError(absl::StrCat("OPENSSL_init_ssl: ", OpenSslErrors()));
  }
  const std::vector<Setting> system = SystemDefaultSettings();
  ASSIGN_OR_RETURN(const std::string text, Configuration(system));
  ConfPtr conf(NCONF_new(nullptr));
  BIO* bio = BIO_new_mem_buf(text.data(), static_cast<int>(text.size()));
  long error_line = 0;
  const bool parsed =
      conf != nullptr && bio != nullptr && NCONF_load_bio(conf.get(), bio, &error_line) > 0;
  BIO_free(bio);
  if (!parsed) {
    return absl::InternalError(absl::StrCat("OpenSSL refused the configuration (line ", error_line,
                                            "): ", OpenSslErrors()));
  }
  if (CONF_modules_load(conf.get(), "strata_tls", 0) <= 0) {
    return absl::InternalError(absl::StrCat("CONF_modules_load: ", OpenSslErrors()));
  }
  return CheckNewContext(Sets(system, "Ciphersuites"));
}

void PreferAes128GcmWithTls(const TlsFiles& tls, absl::string_view component) {
  if (!tls.enabled()) return;
  if (absl::Status preferred = PreferAes128Gcm(); !preferred.ok()) {
    LogEventCat(component, "TLS keeps OpenSSL's cipher order: ", preferred.ToString());
  }
}

}  // namespace strata
