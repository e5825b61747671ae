#pragma once
/// A small client of etcd's v3 JSON gateway (plain HTTP on the client port,
/// keys and values base64): what Grace's optional coordination backend needs
/// to elect the host of the coordination service (a leader key under a
/// lease) and to learn where it is. Every call is bounded by a timeout and
/// tries the endpoints in turn, so one lost etcd member is not a failure.
///
/// Not a general etcd client: leases (grant, keep-alive, revoke), a
/// create-if-absent transaction, put, get and delete.

#include "runtime/base/error.hpp"

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace grace {

struct etcd_value {
  std::string value;
  int64_t create_revision = 0;  ///< monotonic across the cluster's history: an epoch
  int64_t mod_revision = 0;
  int64_t lease = 0;
};

class etcd_client {
public:
  /// `endpoints`: "http://a.b.c.d:port" or "a.b.c.d:port" (several, comma
  /// separated); an error names a malformed one.
  static result<etcd_client> create(const std::string& endpoints,
                                    std::chrono::milliseconds timeout = std::chrono::milliseconds(1000));

  /// A lease of `ttl_seconds` (etcd's minimum is about 2 s).
  result<int64_t> grant_lease(int ttl_seconds);
  /// Renews a lease; its remaining TTL in seconds, or errc::disconnected
  /// "lease ... expired" once etcd no longer has it.
  result<int64_t> keep_alive(int64_t lease);
  status revoke(int64_t lease);
  /// Puts `value` under `key` with `lease` unless the key exists. True when
  /// this call created it; otherwise false and `current` holds what is there.
  result<bool> create_if_absent(const std::string& key, const std::string& value, int64_t lease,
                                std::optional<etcd_value>* current = nullptr);
  /// Puts `value` under `key` (with `lease`, unless 0), whatever is there.
  status put(const std::string& key, const std::string& value, int64_t lease = 0);
  result<std::optional<etcd_value>> get(const std::string& key);
  /// Deletes `key` only while it still holds `value` (so a leader never
  /// removes its successor's key).
  status delete_if_value(const std::string& key, const std::string& value);

  const std::vector<std::string>& endpoints() const noexcept { return endpoints_; }

private:
  etcd_client() = default;
  /// POSTs a JSON body to `path` on the first endpoint that answers.
  result<std::string> post(const std::string& path, const std::string& body);

  std::vector<std::string> endpoints_;  ///< "a.b.c.d:port"
  std::chrono::milliseconds timeout_{1000};
  size_t next_ = 0;  ///< the endpoint that answered last
};

}  // namespace grace
