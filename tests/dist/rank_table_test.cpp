#include <gtest/gtest.h>

#include "core/check.h"
#include "dist/rank_table.h"

namespace rn {
namespace {

const char* kGood = R"({
  "interface": "eth0",
  "hosts": [{"name": "node1", "address": "10.0.0.1"}, {"name": "node2", "address": "10.0.0.2", "interface": "ib0"}],
  "ranks": [{"rank": 1, "host": "node1", "device": 1}, {"rank": 0, "host": "node1", "device": 0},
            {"rank": 2, "host": "node2", "device": 0}]
})";

std::string error_of(const std::string& json) {
  try {
    parse_rank_table(json, "t.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RankTable, ParsesHostsRanksDevicesAndInterfaces) {
  const RankTable t = parse_rank_table(kGood, "t.json");
  ASSERT_EQ(t.world_size(), 3);
  EXPECT_EQ(t.ranks[0].rank, 0);
  EXPECT_EQ(t.ranks[1].device, 1);
  EXPECT_EQ(t.host_of(2).name, "node2");
  EXPECT_EQ(t.host_of(0).interface, "eth0");  // the default
  EXPECT_EQ(t.host_of(2).interface, "ib0");   // the host's own
  EXPECT_EQ(t.launch_name(t.host_of(2)), "10.0.0.2");
}

TEST(RankTable, ARankWithoutADeviceTakesItsPlaceOnItsHost) {
  const RankTable t = parse_rank_table(R"({"hosts": [{"name": "a"}, {"name": "b"}],
      "ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "b"}, {"rank": 2, "host": "a"},
                {"rank": 3, "host": "b", "device": 5}]})",
                                       "t.json");
  ASSERT_EQ(t.world_size(), 4);
  EXPECT_EQ(t.ranks[0].device, 0);
  EXPECT_EQ(t.ranks[1].device, 0);
  EXPECT_EQ(t.ranks[2].device, 1);  // the second rank of host a
  EXPECT_EQ(t.ranks[3].device, 5);  // as given
  // A gap is named as a gap, not as two ranks on device 0.
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a"}], "ranks": [{"rank": 0, "host": "a"}, {"rank": 2, "host": "a"}]})")
                .find("rank 1 is missing"),
            std::string::npos);
  // A given device can still meet a defaulted one; the message says which was defaulted.
  const std::string e = error_of(
      R"({"hosts": [{"name": "a"}], "ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "a", "device": 0}]})");
  EXPECT_NE(e.find("rank 1 and rank 0 both use device 0 of host 'a' (its place on the host"), std::string::npos) << e;
}

TEST(RankTable, MistakesAreErrorsThatSayWhatIsWrong) {
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a"}], "ranks": [{"rank": 0, "host": "a", "device": 0},
            {"rank": 1, "host": "a", "device": 0}]})")
                .find("rank 1 and rank 0 both use device 0 of host 'a'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a"}], "ranks": [{"rank": 0, "host": "b"}]})")
                .find("rank 0 names unknown host 'b' (hosts: a)"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a"}], "ranks": [{"rank": 0, "host": "a", "device": 0},
            {"rank": 2, "host": "a", "device": 1}]})")
                .find("rank 1 is missing"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a"}], "ranks": [{"rank": 0, "host": "a", "device": 0},
            {"rank": 0, "host": "a", "device": 1}]})")
                .find("rank 0 is listed twice"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a", "adress": "x"}], "ranks": [{"rank": 0, "host": "a"}]})").find("unknown key 'adress'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a"}, {"name": "a"}], "ranks": [{"rank": 0, "host": "a"}]})")
                .find("host 'a' is listed twice"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a"}], "ranks": [{"rank": -1, "host": "a"}]})")
                .find("non-negative integer"),
            std::string::npos);
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  // A number too large for any type is nlohmann's out_of_range, not a parse_error: it was
  // not caught, and `resnet launch` ended in std::terminate.
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a"}], "ranks": [{"rank": 1e999, "host": "a"}]})").find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a"}], "ranks": [{"rank": 0, "host": "a", "device": 1.5}]})")
                .find("\"device\" must be a non-negative integer, not 1.5"),
            std::string::npos);
  // A value nested 300000 deep is named by a short excerpt: dump() recursed once per level
  // and overflowed the stack.
  const std::string deep = std::string(300000, '[') + std::string(300000, ']');
  EXPECT_NE(error_of(R"({"hosts": [{"name": )" + deep + R"(}], "ranks": [{"rank": 0, "host": "a"}]})")
                .find("\"name\" must be a string, not [[[[[...]]]]]"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"hosts": [], "ranks": []})").find("\"hosts\" must be a non-empty list"), std::string::npos);
  // A key given twice in one object: nlohmann keeps the last value, so the second "device"
  // silently won (and a second "ranks" list replaced the first).
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a"}], "ranks": [{"rank": 0, "host": "a", "device": 0, "device": 1}]})")
                .find("t.json: the key \"device\" is given twice in one object"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a"}], "ranks": [{"rank": 0, "host": "a"}], "ranks": []})")
                .find("the key \"ranks\" is given twice"),
            std::string::npos);
  // The address is what mpirun's host list gets when there is one: the same separators.
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a", "address": "fe80::1"}], "ranks": [{"rank": 0, "host": "a"}]})")
                .find("address 'fe80::1' holds ',', ':' or a space"),
            std::string::npos);
  EXPECT_NE(
      error_of(R"({"hosts": [{"name": "a", "address": "10.0.0.2,10.0.0.3"}], "ranks": [{"rank": 0, "host": "a"}]})")
          .find("address '10.0.0.2,10.0.0.3' holds"),
      std::string::npos);
  // mpirun reaches a host by its address, else its name: host a's address "b" is host b.
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a", "address": "b"}, {"name": "b"}],
            "ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "b"}]})")
                .find("host 'a' has the address b, which is host 'b''s name"),
            std::string::npos);
  EXPECT_EQ(error_of(R"({"hosts": [{"name": "a", "address": "b"}, {"name": "b", "address": "10.0.0.2"}],
            "ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "b"}]})"),
            "");
  // The same key in two objects is no duplicate.
  EXPECT_EQ(error_of(R"({"hosts": [{"name": "a"}], "ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "a"}]})"),
            "");
  // mpirun would read "a,b" as two hosts and "a:4" as four slots on one.
  EXPECT_NE(error_of(R"({"hosts": [{"name": "a,b"}], "ranks": [{"rank": 0, "host": "a,b"}]})")
                .find("host name 'a,b' holds ',', ':' or a space"),
            std::string::npos);
}

TEST(RankTable, PlacementIsChecked) {
  const RankTable t = parse_rank_table(kGood, "t.json");
  EXPECT_NO_THROW(check_rank_placement(t, 0, 3, "node1", {}));
  EXPECT_NO_THROW(check_rank_placement(t, 2, 3, "somewhere", {"127.0.0.1", "10.0.0.2"}));  // by address
  // "localhost" is any machine (mpirun starts such ranks where it runs).
  const RankTable local =
      parse_rank_table(R"({"hosts": [{"name": "localhost"}], "ranks": [{"rank": 0, "host": "localhost"}]})", "l.json");
  EXPECT_NO_THROW(check_rank_placement(local, 0, 1, "vm7", {"10.1.2.3"}));
  try {
    check_rank_placement(t, 2, 3, "node1", {"10.0.0.1"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 belongs on host 'node2' (10.0.0.2) but was started on 'node1'"),
              std::string::npos)
        << e.what();
  }
  try {
    check_rank_placement(t, 0, 4, "node1", {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has 3 ranks but the launcher started 4"), std::string::npos) << e.what();
  }
}

TEST(RankTable, LocalAddressesIncludeLoopback) {
  const auto a = local_addresses();
  EXPECT_NE(std::find(a.begin(), a.end(), "127.0.0.1"), a.end());
  EXPECT_FALSE(local_hostname().empty());
}

}  // namespace
}  // namespace rn
