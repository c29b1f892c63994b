#ifndef KNAPFORMER_TESTS_PLANNER_MAKE_WORLD_H_
#define KNAPFORMER_TESTS_PLANNER_MAKE_WORLD_H_

#include <cstdint>
#include <string>

#include "gtest/gtest.h"
#include "planner/topology.h"

namespace knapformer {
namespace testing_util {

// The world of `world_size` ranks on topology `spec`; a test failure naming
// the error if either is refused.
inline World MakeWorld(const std::string& spec, int64_t world_size) {
  auto topology = Topology::Parse(spec);
  EXPECT_TRUE(topology.ok()) << topology.status();
  auto world = World::Create(*topology, world_size);
  EXPECT_TRUE(world.ok()) << world.status();
  return *world;
}

}  // namespace testing_util
}  // namespace knapformer

#endif  // KNAPFORMER_TESTS_PLANNER_MAKE_WORLD_H_
