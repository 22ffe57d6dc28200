#include "tools/bench/crypto_probe.h"

#include <openssl/evp.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/clock.h"

namespace strata {
namespace {

constexpr int kRecordBytes = 16384;  // TLS's largest record

double MeasureCipher(const EVP_CIPHER* cipher, double seconds) {
  std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)> ctx(EVP_CIPHER_CTX_new(),
                                                                      &EVP_CIPHER_CTX_free);
  const std::vector<unsigned char> key(32, 7), iv(12, 9);
  std::vector<unsigned char> in(kRecordBytes, 1), out(kRecordBytes + 16);
  if (ctx == nullptr ||
      EVP_EncryptInit_ex(ctx.get(), cipher, nullptr, key.data(), iv.data()) != 1) {
    return -1;
  }
  uint64_t bytes = 0;
  const absl::Time started = absl::Now();
  absl::Duration elapsed;
  do {
    for (int i = 0; i < 64; ++i) {  // one record each, with its tag, as TLS seals them
      int len = 0;
      if (EVP_EncryptInit_ex(ctx.get(), nullptr, nullptr, nullptr, iv.data()) != 1 ||
          EVP_EncryptUpdate(ctx.get(), out.data(), &len, in.data(), kRecordBytes) != 1 ||
          EVP_EncryptFinal_ex(ctx.get(), out.data() + len, &len) != 1 ||
          EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, 16, out.data() + kRecordBytes) !=
              1) {
        return -1;
      }
      bytes += kRecordBytes;
    }
    elapsed = absl::Now() - started;
  } while (absl::ToDoubleSeconds(elapsed) < seconds);
  return static_cast<double>(bytes) / absl::ToDoubleSeconds(elapsed) / 1e9;
}

}  // namespace

double MeasureAesGcmGBps(double seconds) {
  return std::max(MeasureCipher(EVP_aes_128_gcm(), seconds / 2),
                  MeasureCipher(EVP_aes_256_gcm(), seconds / 2));
}

}  // namespace strata
