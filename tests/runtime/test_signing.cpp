#include "runtime/checkpoint/signing.hpp"

#include "runtime/checkpoint/checkpoint.hpp"
#include "runtime/checkpoint/manifest.hpp"
#include "../temp_dir.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include <fstream>
#include <vector>

using namespace grace;
namespace fs = std::filesystem;

namespace {

nlohmann::json sample_manifest() {
  return nlohmann::json{{"format", "grace-checkpoint"}, {"step", 30}, {"wall_time", 1765100000.123456789},
                        {"counters", {{"steps_done", 30}}}, {"files", nlohmann::json::array()}};
}

bool mentions(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

/// A store with one float tensor saved at `step`, signed with `key` (none: unsigned).
void save_step(const fs::path& dir, uint64_t step, const std::optional<checkpoint_key>& key, std::vector<float>& w) {
  checkpoint_store store(dir);
  store.set_signing_key(key);
  checkpoint_meta m;
  m.step = step;
  m.world_size = 1;
  m.run_id = "signing-test";
  std::vector<snapshot_tensor> t{{"w", dtype::f32, {static_cast<int64_t>(w.size())}, w.data(), w.size() * 4}};
  REQUIRE(store.save(t, m).ok());
}

}  // namespace

TEST_CASE("signing: a signed manifest verifies, and any change, another key or no signature is named", "[signing]") {
  const auto key = make_checkpoint_key(std::string(32, 'k'), "test");
  auto m = sample_manifest();
  CHECK(mentions(manifest_signature_problem(m, key), "unsigned"));
  sign_manifest(m, key);
  CHECK(manifest_key_id(m) == key.id);
  CHECK(manifest_signature_problem(m, key).empty());
  // A reader sees the manifest parsed back from its text: still valid.
  CHECK(manifest_signature_problem(nlohmann::json::parse(m.dump(2)), key).empty());

  auto changed = m;
  changed["counters"]["steps_done"] = 31;
  CHECK(mentions(manifest_signature_problem(changed, key), "does not match"));
  auto added = m;
  added["files"].push_back({{"name", "extra"}});
  CHECK(mentions(manifest_signature_problem(added, key), "does not match"));

  const auto other = make_checkpoint_key(std::string(32, 'o'), "other");
  CHECK(other.id != key.id);
  CHECK(mentions(manifest_signature_problem(m, other), "signed with another key (key id " + key.id));

  auto malformed = m;
  malformed["signature"] = "yes";
  CHECK(mentions(manifest_signature_problem(malformed, key), "malformed"));
  auto weak = m;
  weak["signature"]["algorithm"] = "CRC32";
  CHECK(mentions(manifest_signature_problem(weak, key), "CRC32"));
}

TEST_CASE("signing: the job's key is derived from its secret, the same on every member", "[signing]") {
  auto a = checkpoint_key_from_job_secret("0123456789abcdef0123");
  auto b = checkpoint_key_from_job_secret("0123456789abcdef0123");
  auto c = checkpoint_key_from_job_secret("0123456789abcdef0124");
  CHECK(a.secret == b.secret);
  CHECK(a.id == b.id);
  CHECK(a.id != c.id);
  CHECK(a.secret != "0123456789abcdef0123");  // never the secret itself
  CHECK(a.id.size() == 16);
}

TEST_CASE("signing: key files must be private and long enough, and the mode chooses the key", "[signing]") {
  grace::testing::temp_dir dir("grace-signing");
  const auto file = (dir.path / "key").string();
  std::ofstream(file) << std::string(64, 'a') << "\n";
  ::chmod(file.c_str(), 0640);
  auto open = read_checkpoint_key_file(file);
  REQUIRE_FALSE(open);
  CHECK(mentions(open.err().message, "chmod 600"));
  ::chmod(file.c_str(), 0600);
  auto k = read_checkpoint_key_file(file);
  REQUIRE(k);
  CHECK(k->secret == std::string(64, 'a'));
  const auto short_file = (dir.path / "short").string();
  std::ofstream(short_file) << "abc\n";
  ::chmod(short_file.c_str(), 0600);
  CHECK(mentions(read_checkpoint_key_file(short_file).err().message, "at least 32"));

  const std::string secret = "0123456789abcdef0123";
  auto pick = [&](const std::string& f, signing_mode m, bool given) { return choose_checkpoint_key(f, m, secret, given); };
  CHECK_FALSE(*pick("", signing_mode::automatic, false));  // a random secret: unsigned by default
  CHECK((*pick("", signing_mode::automatic, true))->id == checkpoint_key_from_job_secret(secret).id);
  CHECK((*pick("", signing_mode::job, false))->id == checkpoint_key_from_job_secret(secret).id);
  CHECK((*pick(file, signing_mode::automatic, true))->id == k->id);  // the key file wins
  CHECK_FALSE(*pick("", signing_mode::off, true));
  CHECK(mentions(pick(file, signing_mode::off, true).err().message, "give one of them"));
  CHECK_FALSE(choose_checkpoint_key("", signing_mode::job, "", false));
  CHECK_FALSE(parse_signing_mode("sometimes", "--checkpoint-signing"));
}

TEST_CASE("signing: a signing store restores its own newest step, skipping planted ones", "[signing][checkpoint]") {
  grace::testing::temp_dir dir("grace-signing");
  const auto key = make_checkpoint_key(std::string(40, 'j'), "the job's secret");
  const auto other = make_checkpoint_key(std::string(40, 'x'), "an attacker's");
  std::vector<float> w10(8, 1.0f), w20(8, 2.0f), w30(8, 3.0f);
  save_step(dir.path, 10, key, w10);
  save_step(dir.path, 20, std::nullopt, w20);  // planted: unsigned
  save_step(dir.path, 30, other, w30);         // planted: another key

  checkpoint_store store(dir.path);
  store.set_signing_key(key);
  CHECK(store.newest_valid_step() == 10);
  CHECK(mentions(store.verify(20).err().message, "unsigned"));
  CHECK(mentions(store.verify(30).err().message, "another key"));
  std::vector<float> into(8, 0.0f);
  auto r = store.restore_latest({{"w", dtype::f32, {8}, into.data()}});
  REQUIRE(r);
  REQUIRE(r->found);
  CHECK(r->manifest.step == 10);
  CHECK(into == w10);
  CHECK(r->skipped.size() == 2);

  checkpoint_store unchecked(dir.path);  // signing off: nothing checked, the newest restores
  CHECK(unchecked.newest_valid_step() == 30);
  auto j = read_json(dir.path / step_dir_name(10) / manifest_file_name);
  REQUIRE(j);
  CHECK(manifest_key_id(*j) == key.id);
  CHECK(j->contains("files"));  // an ordinary manifest with one more field
}
