#include "runtime/net/etcd_client.hpp"

#include "runtime/base/posix_file.hpp"

#include "runtime/base/base64.hpp"
#include "runtime/net/tcp.hpp"

#include <nlohmann/json.hpp>
#include <unistd.h>

namespace grace {

namespace {

using json = nlohmann::json;

constexpr size_t max_reply = 1 << 20;

int64_t as_int(const json& j, const char* key) {
  if (!j.contains(key)) return 0;
  auto& v = j[key];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) {
    try {
      return std::stoll(v.get<std::string>());
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

etcd_value to_value(const json& kv) {
  etcd_value v;
  auto decoded = base64_decode(kv.value("value", std::string()));
  v.value = decoded ? *decoded : std::string();
  v.create_revision = as_int(kv, "create_revision");
  v.mod_revision = as_int(kv, "mod_revision");
  v.lease = as_int(kv, "lease");
  return v;
}

/// The JSON body of an HTTP/1.0 reply; an error for any status but 200.
result<json> parse_reply(const std::string& raw) {
  auto sep = raw.find("\r\n\r\n");
  if (raw.compare(0, 9, "HTTP/1.0 ") != 0 && raw.compare(0, 9, "HTTP/1.1 ") != 0)
    return error{errc::failed, "etcd: not an HTTP reply"};
  const std::string status_line = raw.substr(0, raw.find("\r\n"));
  if (sep == std::string::npos) return error{errc::failed, "etcd: truncated reply (" + status_line + ")"};
  json body = json::parse(raw.substr(sep + 4), nullptr, false);
  if (status_line.compare(9, 3, "200") != 0)
    return error{errc::failed, "etcd: " + status_line + (body.is_object() ? ": " + body.value("message", "") : "")};
  if (!body.is_object()) return error{errc::failed, "etcd: the reply is not a JSON object"};
  return body;
}

}  // namespace

result<etcd_client> etcd_client::create(const std::string& endpoints, std::chrono::milliseconds timeout) {
  etcd_client c;
  c.timeout_ = timeout;
  for (size_t p = 0; p <= endpoints.size();) {
    auto q = endpoints.find(',', p);
    auto ep = endpoints.substr(p, q == std::string::npos ? std::string::npos : q - p);
    if (ep.rfind("http://", 0) == 0) ep = ep.substr(7);
    while (!ep.empty() && ep.back() == '/') ep.pop_back();
    if (ep.empty() || ep.find(':') == std::string::npos || ep.find('/') != std::string::npos)
      return error{errc::invalid_input, "etcd endpoint '" + ep + "': expected http://ADDRESS:PORT"};
    c.endpoints_.push_back(ep);
    if (q == std::string::npos) break;
    p = q + 1;
  }
  if (c.endpoints_.empty()) return error{errc::invalid_input, "no etcd endpoint given"};
  return c;
}

result<std::string> etcd_client::post(const std::string& path, const std::string& body) {
  std::string last;
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    const auto& ep = endpoints_[(next_ + i) % endpoints_.size()];
    auto fd = tcp::connect_to(ep, timeout_);
    if (!fd) {
      last = fd.err().message;
      continue;
    }
    std::string req = "POST " + path + " HTTP/1.0\r\nHost: " + ep +
                      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                      "\r\n\r\n" + body;
    fd_guard conn(*fd);
    result<std::string> reply = error{errc::disconnected, "send failed"};
    if (tcp::send_all(*fd, req)) reply = tcp::read_to_end(*fd, max_reply);
    conn.reset();
    if (!reply) {
      last = ep + ": " + reply.err().message;
      continue;
    }
    next_ = (next_ + i) % endpoints_.size();
    return reply;
  }
  return error{errc::disconnected, "no etcd endpoint answered (last: " + last + ")"};
}

result<int64_t> etcd_client::grant_lease(int ttl_seconds) {
  auto r = post("/v3/lease/grant", json{{"TTL", ttl_seconds}}.dump());
  if (!r) return r.err();
  auto j = parse_reply(*r);
  if (!j) return j.err();
  auto id = as_int(*j, "ID");
  if (!id) return error{errc::failed, "etcd: lease grant without an ID: " + j->value("error", std::string())};
  return id;
}

result<int64_t> etcd_client::keep_alive(int64_t lease) {
  auto r = post("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump());
  if (!r) return r.err();
  auto j = parse_reply(*r);
  if (!j) return j.err();
  auto ttl = j->contains("result") ? as_int((*j)["result"], "TTL") : 0;
  if (ttl <= 0) return error{errc::disconnected, "etcd lease " + std::to_string(lease) + " expired"};
  return ttl;
}

status etcd_client::revoke(int64_t lease) {
  auto r = post("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump());
  if (!r) return r.err();
  auto j = parse_reply(*r);
  return j ? status{} : status{j.err()};
}

result<bool> etcd_client::create_if_absent(const std::string& key, const std::string& value, int64_t lease,
                                           std::optional<etcd_value>* current) {
  const auto k = base64_encode(key);
  json put{{"key", k}, {"value", base64_encode(value)}};
  if (lease) put["lease"] = std::to_string(lease);
  json txn{{"compare", json::array({{{"key", k}, {"target", "CREATE"}, {"create_revision", "0"}}})},
           {"success", json::array({{{"request_put", put}}})},
           {"failure", json::array({{{"request_range", {{"key", k}}}}})}};
  auto r = post("/v3/kv/txn", txn.dump());
  if (!r) return r.err();
  auto j = parse_reply(*r);
  if (!j) return j.err();
  if (j->value("succeeded", false)) return true;
  if (current) {
    current->reset();
    for (auto& resp : j->value("responses", json::array()))
      if (resp.contains("response_range"))
        for (auto& kv : resp["response_range"].value("kvs", json::array())) *current = to_value(kv);
  }
  return false;
}

status etcd_client::put(const std::string& key, const std::string& value, int64_t lease) {
  json body{{"key", base64_encode(key)}, {"value", base64_encode(value)}};
  if (lease) body["lease"] = std::to_string(lease);
  auto r = post("/v3/kv/put", body.dump());
  if (!r) return r.err();
  auto j = parse_reply(*r);
  return j ? status{} : status{j.err()};
}

result<std::optional<etcd_value>> etcd_client::get(const std::string& key) {
  auto r = post("/v3/kv/range", json{{"key", base64_encode(key)}}.dump());
  if (!r) return r.err();
  auto j = parse_reply(*r);
  if (!j) return j.err();
  std::optional<etcd_value> out;
  for (auto& kv : j->value("kvs", json::array())) out = to_value(kv);
  return out;
}

status etcd_client::delete_if_value(const std::string& key, const std::string& value) {
  const auto k = base64_encode(key);
  json txn{{"compare", json::array({{{"key", k}, {"target", "VALUE"}, {"value", base64_encode(value)}}})},
           {"success", json::array({{{"request_delete_range", {{"key", k}}}}})}};
  auto r = post("/v3/kv/txn", txn.dump());
  if (!r) return r.err();
  auto j = parse_reply(*r);
  return j ? status{} : status{j.err()};
}

}  // namespace grace
