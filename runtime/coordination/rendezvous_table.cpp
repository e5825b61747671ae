#include "runtime/coordination/rendezvous_table.hpp"

namespace grace {

namespace {
std::string over(const char* what, size_t limit) {
  return std::string("limit: ") + what + " (at most " + std::to_string(limit) + ")";
}
}  // namespace

rendezvous_table::set_result rendezvous_table::set(const std::string& key, std::vector<uint8_t> value) {
  set_result out;
  if (key.size() > limits_.key_bytes) out.error = over("key too long", limits_.key_bytes);
  else if (value.size() > limits_.value_bytes) out.error = over("value too large", limits_.value_bytes);
  else if (kv_.count(key)) out.error = "already exists: " + key;
  else if (kv_.size() >= limits_.keys) out.error = over("too many keys", limits_.keys);
  else if (bytes_ + key.size() + value.size() > limits_.total_bytes)
    out.error = over("keys and values take too many bytes", limits_.total_bytes);
  if (!out.error.empty()) return out;
  bytes_ += key.size() + value.size();
  auto& v = kv_[key] = std::move(value);
  out.ok = true;
  for (auto it = gets_.begin(); it != gets_.end();) {
    if (it->second == key) {
      out.woken.push_back({it->first, true, v, ""});
      it = gets_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

rendezvous_table::get_result rendezvous_table::get(const std::string& key, uint64_t waiter, bool may_wait) {
  get_result out;
  if (key.size() > limits_.key_bytes) {
    out.error = over("key too long", limits_.key_bytes);
    return out;
  }
  auto it = kv_.find(key);
  if (it != kv_.end()) {
    out.what = get_result::type::found;
    out.value = it->second;
    return out;
  }
  if (!may_wait) {
    out.error = "not found: " + key;
    return out;
  }
  if (broken_) {
    out.error = *broken_ + "; key " + key + " will not come";
    return out;
  }
  if (gets_.size() >= limits_.pending_gets) {
    out.error = over("too many gets waiting", limits_.pending_gets);
    return out;
  }
  gets_[waiter] = key;
  out.what = get_result::type::pending;
  return out;
}

std::optional<rendezvous_table::reply> rendezvous_table::expire(uint64_t waiter) {
  auto it = gets_.find(waiter);
  if (it == gets_.end()) return std::nullopt;
  reply r{waiter, false, {}, "timeout waiting for key " + it->second};
  gets_.erase(it);
  return r;
}

rendezvous_table::barrier_result rendezvous_table::arrive(const std::string& name, uint32_t rank, uint32_t count,
                                                          uint64_t waiter) {
  barrier_result out;
  if (broken_) {
    out.error = *broken_ + "; barrier " + name + " cannot complete";
    return out;
  }
  if (count == 0) {
    out.error = "barrier '" + name + "': count must be at least 1";
    return out;
  }
  if (name.size() > limits_.key_bytes) out.error = over("barrier name too long", limits_.key_bytes);
  else if (count > limits_.barrier_count) out.error = over("barrier count", limits_.barrier_count);
  else if (!barriers_.count(name) && barriers_.size() >= limits_.barriers)
    out.error = over("too many barriers waiting", limits_.barriers);
  if (!out.error.empty()) return out;
  auto& b = barriers_[name];
  if (b.count == 0) b.count = count;
  if (b.count != count) {
    out.error = "barrier '" + name + "' count mismatch: " + std::to_string(count) + " != " + std::to_string(b.count);
    return out;
  }
  b.arrived.insert(rank);
  b.waiters.push_back(waiter);
  if (b.arrived.size() < b.count) {
    out.pending = true;
    return out;
  }
  for (auto w : b.waiters) out.released.push_back({w, true, {}, ""});
  barriers_.erase(name);
  out.pending = true;  // this arrival is answered through `released` like the others
  return out;
}

std::vector<rendezvous_table::reply> rendezvous_table::fail_waiters(const std::string& why) {
  std::vector<reply> out;
  for (auto& [w, key] : gets_) out.push_back({w, false, {}, why + " (waiting for key " + key + ")"});
  gets_.clear();
  for (auto& [name, b] : barriers_)
    for (auto w : b.waiters) out.push_back({w, false, {}, why + " (barrier " + name + ")"});
  barriers_.clear();
  return out;
}

std::vector<rendezvous_table::reply> rendezvous_table::break_group(const std::string& why) {
  if (!broken_) broken_ = why;
  return fail_waiters(why);
}

std::vector<rendezvous_table::reply> rendezvous_table::reset(const std::string& why) {
  auto out = fail_waiters(why);
  kv_.clear();
  bytes_ = 0;
  broken_.reset();
  return out;
}

}  // namespace grace
