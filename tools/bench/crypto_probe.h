// The TLS cost floor: how fast one core encrypts with AES-GCM (the AEAD of
// TLS 1.3's first cipher suites, AES-NI/VAES where the CPU has them),
// measured with OpenSSL's EVP interface over 16 KiB records as TLS sends
// them. Every byte on a TLS channel is encrypted once and decrypted once
// (at about the same speed), so a step that moves B bytes over TLS spends
// at least 2 * B / rate CPU-seconds on cryptography.
#ifndef STRATA_TOOLS_BENCH_CRYPTO_PROBE_H_
#define STRATA_TOOLS_BENCH_CRYPTO_PROBE_H_

namespace strata {

// One core's AES-GCM encryption rate in GB/s: the faster of AES-128-GCM and
// AES-256-GCM, each for about `seconds`. Negative when OpenSSL fails.
double MeasureAesGcmGBps(double seconds);

}  // namespace strata

#endif  // STRATA_TOOLS_BENCH_CRYPTO_PROBE_H_
