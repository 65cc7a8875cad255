// SHA-256 for golden input digests and the golden MANIFEST: OpenSSL's (libcrypto, EVP), the
// implementation the hashes can be checked against with `sha256sum` or `openssl dgst`.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace attncheck {

class Sha256 {
 public:
  Sha256();  // throws std::runtime_error when libcrypto cannot start a digest
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t bytes);
  void update(std::string_view s) { update(s.data(), s.size()); }
  std::array<uint8_t, 32> digest();  // finishes; the object must not be updated afterwards
  std::string hex();                 // digest() as 64 lowercase hex digits

 private:
  struct Context;
  std::unique_ptr<Context> ctx_;
};

std::string sha256_hex(std::string_view data);
// Throws std::runtime_error naming the file when it cannot be read.
std::string sha256_file(const std::string& path);
// The library that computes the hashes ("OpenSSL 3.0.19 ..."), for provenance.
std::string sha256_provider();

}  // namespace attncheck
