#include "runtime/coordination/admission.hpp"

#include <catch2/catch.hpp>

#include <set>

using namespace grace;

namespace {

using av = admission::verdict;

/// A service of 4 ranks in incarnation 3, ranks 0 and 1 joined, rank 2 left.
struct service {
  std::set<uint32_t> joined{0, 1}, left{2}, lost;
  admission_state s;
  service() {
    s.protocol_version = 7;
    s.token = "0123456789abcdef0123456789abcdef";
    s.run_id = "run";
    s.world_size = 4;
    s.incarnation = 3;
    s.has_members = true;
    s.joined = [this](uint32_t r) { return joined.count(r) > 0; };
    s.left = [this](uint32_t r) { return left.count(r) > 0; };
    s.lost = [this](uint32_t r) { return lost.count(r) > 0; };
  }
};

join_request join_as(uint32_t rank) {
  join_request j;
  j.protocol_version = 7;
  j.token = "0123456789abcdef0123456789abcdef";
  j.run_id = "run";
  j.rank = rank;
  j.world_size = 4;
  j.incarnation = 3;
  return j;
}

}  // namespace

TEST_CASE("admission: a join that matches the job is admitted", "[admission]") {
  service svc;
  auto a = admit(join_as(3), svc.s);
  CHECK(a.what == av::admit);
  CHECK(a.reason.empty());
}

TEST_CASE("admission: a wrong protocol, secret, world size, rank or run id is refused", "[admission]") {
  service svc;
  auto j = join_as(3);
  j.protocol_version = 6;
  CHECK(admit(j, svc.s).what == av::refuse);
  CHECK(admit(j, svc.s).reason == "protocol version 6 != coordinator's 7");
  j = join_as(3);
  j.token = "0123456789abcdef0123456789abcdeX";
  CHECK(admit(j, svc.s).reason == "wrong job token");
  j = join_as(3);
  j.world_size = 5;
  CHECK(admit(j, svc.s).what == av::refuse);
  CHECK(admit(j, svc.s).reason == "world size 5 != job's 4");
  j = join_as(4);
  CHECK(admit(j, svc.s).reason == "rank 4 out of range");
  j = join_as(3);
  j.run_id = "other";
  CHECK(admit(j, svc.s).reason == "run id 'other' != job's 'run'");
}

TEST_CASE("admission: the secret is checked before anything else the joiner says", "[admission]") {
  service svc;
  auto j = join_as(9);  // out of range and a wrong run id, too
  j.token = "not the job's secret, not the job's";
  j.run_id = "other";
  CHECK(admit(j, svc.s).reason == "wrong job token");
}

TEST_CASE("admission: another incarnation or a rank already in this one is refused for now", "[admission]") {
  service svc;
  auto j = join_as(3);
  j.incarnation = 2;
  CHECK(admit(j, svc.s).what == av::refuse_for_now);
  CHECK(admit(j, svc.s).reason == "incarnation 2 != current 3");
  auto a = admit(join_as(1), svc.s);
  CHECK(a.what == av::refuse_for_now);
  CHECK(a.reason == "duplicate rank 1 in incarnation 3");
  CHECK(admit(join_as(2), svc.s).reason == "duplicate rank 2 in incarnation 3");  // it left
}

TEST_CASE("admission: the first join of the next incarnation advances only once the old group is gone",
          "[admission]") {
  service svc;
  auto j = join_as(0);
  j.incarnation = 4;
  CHECK(admit(j, svc.s).what == av::refuse_for_now);  // members are live
  svc.s.group_gone = true;
  CHECK(admit(j, svc.s).what == av::advance);
  // The actor starts incarnation 4 and asks again: admitted.
  svc.s.incarnation = 4;
  svc.s.has_members = false;
  svc.s.group_gone = false;
  svc.joined.clear();
  svc.left.clear();
  CHECK(admit(j, svc.s).what == av::admit);
  j.incarnation = 6;  // two ahead: never an advance
  svc.s.has_members = true;
  svc.s.group_gone = true;
  CHECK(admit(j, svc.s).what == av::refuse_for_now);
}

TEST_CASE("admission: every member must see the same directory layout and state kind", "[admission]") {
  service svc;
  svc.s.node_local = 2;
  auto j = join_as(3);
  auto a = admit(j, svc.s);
  CHECK(a.what == av::refuse);
  CHECK(a.reason ==
        "rank 3 has a shared checkpoint directory, the members joined before node-local ones: every member of a job "
        "must see the same layout");
  j.node_local = 4;  // node-local too, but another number of ranks per node
  CHECK(admit(j, svc.s).what == av::refuse);
  j.node_local = 2;
  CHECK(admit(j, svc.s).what == av::admit);
  j.sharded = true;
  CHECK(admit(j, svc.s).reason ==
        "rank 3 holds sharded state, the members joined before do not: every member of a job must register the same "
        "tensors");
  svc.s.has_members = false;  // the first member sets the layout
  CHECK(admit(j, svc.s).what == av::admit);
}

TEST_CASE("admission: a rejoin is admitted only during a takeover of its incarnation, once per rank",
          "[admission]") {
  service svc;
  auto j = join_as(3);
  j.rejoin = true;
  CHECK(admit(j, svc.s).what == av::refuse_for_now);
  CHECK(admit(j, svc.s).reason == "no takeover of incarnation 3 here (current 3, takeover closed)");
  svc.s.takeover = true;
  CHECK(admit(j, svc.s).what == av::admit);
  svc.lost.insert(3);
  CHECK(admit(j, svc.s).reason == "rank 3 already rejoined or lost in incarnation 3");
  j = join_as(0);
  j.rejoin = true;
  CHECK(admit(j, svc.s).reason == "rank 0 already rejoined or lost in incarnation 3");
  j.incarnation = 2;
  CHECK(admit(j, svc.s).reason == "no takeover of incarnation 2 here (current 3, takeover open)");
}

TEST_CASE("admission: an elastic job admits only into the current incarnation's formed group", "[admission]") {
  service svc;
  svc.s.elastic = true;
  svc.s.world_size = 3;  // this incarnation's group
  auto j = join_as(2);
  j.world_size = 3;
  CHECK(admit(j, svc.s).reason == "the group of incarnation 3 is not formed yet");
  svc.s.group_formed = true;
  CHECK(admit(j, svc.s).what == av::refuse_for_now);  // rank 2 left this incarnation
  j = join_as(1);
  j.world_size = 4;  // the old group's size
  auto a = admit(j, svc.s);
  CHECK(a.what == av::refuse_for_now);
  CHECK(a.reason == "world size 4 != the 3 of incarnation 3's group");
  j.world_size = 3;
  j.incarnation = 4;
  CHECK(admit(j, svc.s).reason == "incarnation 4 != current 3");
}
