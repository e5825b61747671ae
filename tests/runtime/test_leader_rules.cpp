#include "runtime/coordination/leader_campaign.hpp"
#include "runtime/coordination/leader_rules.hpp"

#include <catch2/catch.hpp>

using namespace grace;

TEST_CASE("leader lease: a leader acts only while its last renewal is under half the TTL old", "[leadership]") {
  const int64_t s = 1'000'000'000;
  leader_lease l(2 * s);
  CHECK_FALSE(l.may_lead(0));  // never granted
  l.renewed(10 * s);
  CHECK(l.may_lead(10 * s));
  CHECK(l.may_lead(10 * s + s - 1));
  CHECK_FALSE(l.may_lead(10 * s + s));  // half the TTL: stop deciding
  CHECK(l.renew_at() == 10 * s + 2 * s / 6);
  l.renewed(11 * s);
  CHECK(l.may_lead(11 * s + s / 2));
  // The successor can be elected only after etcd dropped the lease (TTL
  // after the last renewal it saw): at least half a TTL after the last
  // moment this leader may act.
  CHECK(11 * s + 2 * s - (11 * s + s) >= s);
}

TEST_CASE("coordinator location: one line, parsed back, bad lines named", "[leadership]") {
  coordinator_location c{"192.0.2.2:29400", 17, 1};
  CHECK(c.to_line() == "192.0.2.2:29400 17 1");
  auto back = coordinator_location::parse(c.to_line());
  REQUIRE(back);
  CHECK(back->endpoint == "192.0.2.2:29400");
  CHECK(back->epoch == 17);
  CHECK(back->node == 1);
  for (const char* bad : {"", "192.0.2.2:29400", "192.0.2.2:29400 x 1", "192.0.2.2 17 1", "a:1 1 1 extra",
                          "192.0.2.2:29400 17 -1"}) {
    INFO(bad);
    auto r = coordinator_location::parse(bad);
    REQUIRE_FALSE(r);
    CHECK(r.err().code == errc::invalid_input);
  }
}

TEST_CASE("a follower keeps its leader, follows a newer one, campaigns when there is none", "[leadership]") {
  coordinator_location a{"192.0.2.1:29400", 5, 0}, b{"192.0.2.2:29400", 9, 1};
  CHECK(next_follow_action(a, a) == follow_action::keep);
  CHECK(next_follow_action(a, b) == follow_action::moved);
  CHECK(next_follow_action(std::nullopt, a) == follow_action::moved);
  CHECK(next_follow_action(b, a) == follow_action::keep);  // an older epoch never wins back
  CHECK(next_follow_action(a, std::nullopt) == follow_action::campaign);
}

TEST_CASE("a newcomer to a job in progress lets the running group's launchers campaign first", "[leadership]") {
  const int64_t defer = 6'000'000'000;
  CHECK(may_campaign(false, false, 0, defer));          // a job's start: nobody led yet
  CHECK(may_campaign(true, true, 0, defer));            // a member of the running group
  CHECK_FALSE(may_campaign(false, true, 0, defer));     // a replacement host: waits ...
  CHECK_FALSE(may_campaign(false, true, defer - 1, defer));
  CHECK(may_campaign(false, true, defer, defer));       // ... unless no survivor took the key
}

TEST_CASE("leader key: value without the epoch, location with the key's create revision", "[leadership]") {
  CHECK(leader_value("192.0.2.2:29500", 1) == "192.0.2.2:29500 1");
  etcd_value v;
  v.value = leader_value("192.0.2.2:29500", 1);
  v.create_revision = 42;
  auto loc = location_from(v);
  REQUIRE(loc);
  CHECK(loc->endpoint == "192.0.2.2:29500");
  CHECK(loc->epoch == 42);
  CHECK(loc->node == 1);
  CHECK(loc->to_line() == "192.0.2.2:29500 42 1");
  v.value = "garbage";
  CHECK_FALSE(location_from(v));
  v.value = "192.0.2.2:99999 1";
  CHECK_FALSE(location_from(v));
}

TEST_CASE("a takeover ends once nobody more is worth waiting for", "[leadership]") {
  // Three nodes of two workers: ranks 0-1 on node 0 (the lost leader), 2-3
  // on node 1, 4-5 on node 2 (the successor).
  takeover_progress p;
  p.world_size = 6;
  p.nproc = 2;
  p.own_node = 2;
  p.lost_leader = 0;
  p.min_ns = 200;
  p.window_ns = 1500;
  std::set<uint32_t> back;
  auto outcome = [&] {
    p.rejoined_count = static_cast<uint32_t>(back.size());
    return takeover_outcome(p, [&](uint32_t r) { return back.count(r) > 0; });
  };
  back = {4, 5, 2};
  p.age_ns = 50;
  CHECK(outcome() == takeover_end::wait);  // rank 3 is still on its way
  back.insert(3);
  CHECK(outcome() == takeover_end::all_but_lost_leader);  // before min_ns: nobody else can come back
  back = {0, 1, 2, 3, 4, 5};
  CHECK(outcome() == takeover_end::everyone);

  SECTION("another node lost too: its launcher never registers, so the wait is min_ns") {
    back = {4, 5};
    p.age_ns = 199;
    CHECK(outcome() == takeover_end::wait);
    p.age_ns = 200;
    CHECK(outcome() == takeover_end::live_nodes);  // node 1 did not register
    p.registered = {1};
    CHECK(outcome() == takeover_end::wait);  // it did: its ranks are awaited
    p.age_ns = 1500;
    CHECK(outcome() == takeover_end::window);
  }
  SECTION("the lost leader not known, or the successor's own node: only the registered nodes count") {
    back = {2, 3, 4, 5};
    p.age_ns = 50;
    p.lost_leader = -1;
    CHECK(outcome() == takeover_end::wait);
    p.lost_leader = 2;
    CHECK(outcome() == takeover_end::wait);
    p.age_ns = 300;
    CHECK(outcome() == takeover_end::live_nodes);
  }
  SECTION("a world that does not fill its last node") {
    p.world_size = 5;  // node 2 holds rank 4 alone
    back = {2, 3, 4};
    p.age_ns = 10;
    CHECK(outcome() == takeover_end::all_but_lost_leader);
  }
}

TEST_CASE("job key: running and finished marks with their epoch, a malformed value read as running",
          "[leadership]") {
  using st = job_mark::state;
  CHECK(read_job_key(std::nullopt).what == st::absent);
  auto r = read_job_key(job_key_value(st::running, 17));
  CHECK(r.what == st::running);
  CHECK(r.epoch == 17);
  auto f = read_job_key(job_key_value(st::finished, 23));
  CHECK(f.what == st::finished);
  CHECK(f.epoch == 23);
  CHECK(read_job_key(std::string("running")).what == st::running);  // a mark without an epoch
  CHECK(read_job_key(std::string("finished")).what == st::running);  // no epoch: never a reason to stop
  CHECK(read_job_key(std::string("finished x")).what == st::running);
  CHECK(read_job_key(std::string("finished 5 6")).what == st::running);
  CHECK(read_job_key(std::string("")).what == st::running);
}

TEST_CASE("a launcher stops for a finished mark only after its first look and only for its own job",
          "[leadership]") {
  job_mark finished{job_mark::state::finished, 40};
  CHECK(job_finished_without_us(finished, false, 40));   // its last leader marked the job finished
  CHECK(job_finished_without_us(finished, false, 12));   // a later leader than the one it saw
  CHECK_FALSE(job_finished_without_us(finished, true, 0));    // first look: a requeued run starts anew
  CHECK_FALSE(job_finished_without_us(finished, false, 41));  // an earlier job's mark: a newer leader ran since
  CHECK_FALSE(job_finished_without_us({job_mark::state::running, 40}, false, 40));
  CHECK_FALSE(job_finished_without_us({}, false, 0));
}
