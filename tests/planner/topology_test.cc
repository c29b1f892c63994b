#include "planner/topology.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::HasSubstr;

TEST(TopologyTest, ParsesThePapersMixedGroup) {
  auto topology = Topology::Parse("g1n2+g2n1+g4n1");
  ASSERT_TRUE(topology.ok()) << topology.status();
  EXPECT_EQ(topology->spec(), "g1n2+g2n1+g4n1");
  EXPECT_EQ(topology->group_size(), 8);
  ASSERT_EQ(topology->num_bags(), 4);
  const std::vector<std::pair<int, int>> expected = {{1, 0}, {1, 1}, {2, 2}, {4, 4}};
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(topology->bag(b).id, b);
    EXPECT_EQ(topology->bag(b).gpus, expected[b].first) << "bag " << b;
    EXPECT_EQ(topology->bag(b).first_rank, expected[b].second) << "bag " << b;
  }
  const std::vector<int> bag_of_rank = {0, 1, 2, 2, 3, 3, 3, 3};
  for (int r = 0; r < 8; ++r) EXPECT_EQ(topology->BagOfRank(r), bag_of_rank[r]) << "rank " << r;
  EXPECT_EQ(topology->max_bag_gpus(), 4);
}

TEST(TopologyTest, SortsTermsBySizeAndMergesEqualSizes) {
  auto topology = Topology::Parse("g4n1+g1n2+g2n1+g1n6");
  ASSERT_TRUE(topology.ok()) << topology.status();
  EXPECT_EQ(topology->spec(), "g1n8+g2n1+g4n1");
  EXPECT_EQ(topology->group_size(), 14);
  EXPECT_EQ(topology->num_bags(), 10);
  EXPECT_EQ(topology->bag(8).gpus, 2);
  EXPECT_EQ(topology->bag(8).first_rank, 8);
  EXPECT_EQ(topology->bag(9).first_rank, 10);
}

TEST(TopologyTest, AcceptsLargeButBoundedGroups) {
  auto topology = Topology::Parse("g8n512");
  ASSERT_TRUE(topology.ok()) << topology.status();
  EXPECT_EQ(topology->group_size(), 4096);
  EXPECT_EQ(topology->bag(511).first_rank, 4088);
}

struct BadSpec {
  const char* spec;
  const char* message;
};

class TopologyErrorTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(TopologyErrorTest, RejectsWithAMessageNamingTheTerm) {
  auto topology = Topology::Parse(GetParam().spec);
  ASSERT_FALSE(topology.ok()) << "accepted '" << GetParam().spec << "'";
  EXPECT_EQ(topology.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(topology.status().message()), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, TopologyErrorTest,
    ::testing::Values(
        BadSpec{"", "empty spec"},
        BadSpec{"g1n2abc", "term 'g1n2abc': unexpected trailing 'abc'"},
        BadSpec{"g0n4", "term 'g0n4': G (GPUs per bag) must be at least 1"},
        BadSpec{"g4n0", "term 'g4n0': N (number of bags) must be at least 1"},
        BadSpec{"g1n2+", "empty term"},
        BadSpec{"+g1n2", "empty term"},
        BadSpec{"g1n2++g2n1", "empty term"},
        BadSpec{"G1n2", "term 'G1n2': must start with 'g'"},
        BadSpec{"g1", "term 'g1': expected 'n'"},
        BadSpec{"gn2", "term 'gn2': expected digits for G"},
        BadSpec{"g1n", "term 'g1n': expected digits for N"},
        BadSpec{" g1n2", "term ' g1n2': must start with 'g'"},
        BadSpec{"g1n2 ", "unexpected trailing ' '"},
        BadSpec{"g-1n2", "term 'g-1n2': expected digits for G"},
        BadSpec{"g99999999999999999999n1", "G (GPUs per bag) exceeds the limit of 1048576"},
        BadSpec{"g1n99999999999999999999", "N (number of bags) exceeds the limit of 1048576"},
        BadSpec{"g1024n1024+g1n1", "more than 1048576 GPUs in the group"},
        BadSpec{"g1n2,g2n1", "unexpected trailing ',g2n1'"}));

TEST(TopologyTest, RejectsOverlongSpecs) {
  std::string spec = "g1n1";
  while (spec.size() <= Topology::kMaxSpecLength) spec += "+g1n1";
  auto topology = Topology::Parse(spec);
  ASSERT_FALSE(topology.ok());
  EXPECT_THAT(std::string(topology.status().message()), HasSubstr("the limit is 4096"));
}

TEST(TopologyTest, HomogeneousSpecsAreTheOneSizeLayoutsThatDivideTheWorld) {
  EXPECT_EQ(HomogeneousSpecs(32, 8), (std::vector<std::string>{"g1n32", "g2n16", "g4n8", "g8n4"}));
  EXPECT_EQ(HomogeneousSpecs(4, 8), (std::vector<std::string>{"g1n4", "g2n2", "g4n1"}));
  EXPECT_EQ(HomogeneousSpecs(6, 8), (std::vector<std::string>{"g1n6", "g2n3"}));
  EXPECT_EQ(HomogeneousSpecs(1, 8), (std::vector<std::string>{"g1n1"}));
  EXPECT_EQ(HomogeneousSpecs(64, 2), (std::vector<std::string>{"g1n64", "g2n32"}));
  for (const std::string& spec : HomogeneousSpecs(96, 8)) {
    auto topology = Topology::Parse(spec);
    ASSERT_TRUE(topology.ok()) << spec;
    EXPECT_TRUE(World::Create(*topology, 96).ok()) << spec;
  }
}

TEST(WorldTest, MapsRanksToReplicaBagAndPositionAndBack) {
  auto topology = Topology::Parse("g1n2+g2n1+g4n1");
  ASSERT_TRUE(topology.ok());
  auto world = World::Create(*topology, 24);
  ASSERT_TRUE(world.ok()) << world.status();
  EXPECT_EQ(world->num_replicas(), 3);
  const RankLocation location = world->Locate(19);  // replica 2, group rank 3
  EXPECT_EQ(location.replica, 2);
  EXPECT_EQ(location.bag, 2);
  EXPECT_EQ(location.position, 1);
  const RankLocation last = world->Locate(23);
  EXPECT_EQ(last.replica, 2);
  EXPECT_EQ(last.bag, 3);
  EXPECT_EQ(last.position, 3);
  for (int32_t rank = 0; rank < 24; ++rank) {
    EXPECT_EQ(world->RankOf(world->Locate(rank)), rank);
  }
}

TEST(WorldTest, RejectsWorldsThatAreNotAMultipleOfTheGroup) {
  auto topology = Topology::Parse("g1n2+g2n1+g4n1");
  ASSERT_TRUE(topology.ok());
  auto world = World::Create(*topology, 12);
  ASSERT_FALSE(world.ok());
  EXPECT_EQ(world.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(world.status().message()),
              HasSubstr("world_size: 12 is not a multiple of the group size 8"));
  EXPECT_FALSE(World::Create(*topology, 0).ok());
  EXPECT_FALSE(World::Create(*topology, -8).ok());
}

}  // namespace
}  // namespace knapformer
