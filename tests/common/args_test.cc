#include "common/args.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace knapformer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// simulate's options, as its users mistype them.
const std::vector<std::string> kSimulate = {
    "data",        "world",         "topology",        "steps",
    "seed",        "d-model",       "gamma",           "refine-rounds",
    "locality",    "cost-model",    "max-tokens-per-gpu", "token-bytes",
    "tflops",      "intra-node-gbps", "inter-node-gbps", "gpus-per-node",
    "element-bytes", "blocks-per-route"};

TEST(EditDistanceTest, CountsInsertionsDeletionsSubstitutionsAndTranspositions) {
  EXPECT_EQ(EditDistance("", ""), 0);
  EXPECT_EQ(EditDistance("", "abc"), 3);
  EXPECT_EQ(EditDistance("abc", ""), 3);
  EXPECT_EQ(EditDistance("topology", "topology"), 0);
  EXPECT_EQ(EditDistance("topologyy", "topology"), 1);  // insertion
  EXPECT_EQ(EditDistance("toplogy", "topology"), 1);    // deletion
  EXPECT_EQ(EditDistance("typology", "topology"), 1);   // substitution
  EXPECT_EQ(EditDistance("stpes", "steps"), 1);         // transposition
  EXPECT_EQ(EditDistance("kitten", "sitting"), 3);
  EXPECT_EQ(EditDistance("sitting", "kitten"), 3);
  // Optimal string alignment: a transposed pair is not edited again.
  EXPECT_EQ(EditDistance("ca", "abc"), 3);
}

TEST(SuggestOptionsTest, NamesTheOptionOneTypoAway) {
  EXPECT_THAT(SuggestOptions("topologyy", kSimulate), ElementsAre("topology"));
  EXPECT_THAT(SuggestOptions("stpes", kSimulate), ElementsAre("steps"));
  EXPECT_THAT(SuggestOptions("dmodel", kSimulate), ElementsAre("d-model"));
  EXPECT_THAT(SuggestOptions("gama", kSimulate), ElementsAre("gamma"));
  EXPECT_THAT(SuggestOptions("inter-node-gbs", kSimulate), ElementsAre("inter-node-gbps"));
}

TEST(SuggestOptionsTest, IgnoresCaseAndUnderscores) {
  EXPECT_THAT(SuggestOptions("d_model", kSimulate), ElementsAre("d-model"));
  EXPECT_THAT(SuggestOptions("Topology", kSimulate), ElementsAre("topology"));
  EXPECT_THAT(SuggestOptions("MAX_TOKENS_PER_GPU", kSimulate), ElementsAre("max-tokens-per-gpu"));
}

TEST(SuggestOptionsTest, AllowsMoreTyposInLongerNames) {
  // 8 characters: two edits.
  EXPECT_THAT(SuggestOptions("topolgoyy", kSimulate), ElementsAre("topology"));
  // 6 characters: one edit only, and "tpolgy" is two from topology.
  EXPECT_THAT(SuggestOptions("tpolgy", kSimulate), IsEmpty());
  // 12 characters and more: three edits, but never four.
  EXPECT_THAT(SuggestOptions("max-tken-pr-gpu", kSimulate), ElementsAre("max-tokens-per-gpu"));
  EXPECT_THAT(SuggestOptions("mx-tken-pr-gpu", kSimulate), IsEmpty());
}

TEST(SuggestOptionsTest, NothingForAnUnrelatedName) {
  EXPECT_THAT(SuggestOptions("bogus", kSimulate), IsEmpty());
  EXPECT_THAT(SuggestOptions("verbose", kSimulate), IsEmpty());
  EXPECT_THAT(SuggestOptions("", kSimulate), IsEmpty());
  EXPECT_THAT(SuggestOptions("topology", {}), IsEmpty());
}

TEST(SuggestOptionsTest, NamesEveryOptionAtTheSameSmallestDistance) {
  EXPECT_THAT(SuggestOptions("seex", {"seed", "steps", "seen"}), ElementsAre("seed", "seen"));
  // The closer one alone, though the other is within the threshold too.
  EXPECT_THAT(SuggestOptions("topologyy", {"topologyxx", "topology"}), ElementsAre("topology"));
}

TEST(SuggestOptionsTest, CompletesAShortenedNameWhenFewOptionsStartWithIt) {
  EXPECT_THAT(SuggestOptions("max-tokens", kSimulate), ElementsAre("max-tokens-per-gpu"));
  EXPECT_THAT(SuggestOptions("inter", kSimulate), ElementsAre("inter-node-gbps"));
  // Too short, or too many starting with it: no guess.
  EXPECT_THAT(SuggestOptions("in", kSimulate), IsEmpty());
  EXPECT_THAT(SuggestOptions("max", {"max-a", "max-b", "max-c", "max-d"}), IsEmpty());
  EXPECT_THAT(SuggestOptions("max", {"max-a", "max-b"}), ElementsAre("max-a", "max-b"));
}

TEST(ArgsTest, ParsesValuesBothWays) {
  auto args = Args::Parse({"--steps", "3", "--topology=g1n8,g2n4"}, kSimulate);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->GetString("topology", ""), "g1n8,g2n4");
  EXPECT_EQ(*args->GetInt("steps", 20, 1, 100), 3);
  EXPECT_EQ(*args->GetInt("seed", 7, 0, 100), 7);
  EXPECT_FALSE(args->Has("seed"));
}

TEST(ArgsTest, AnUnknownOptionNamesTheClosestKnownOne) {
  auto args = Args::Parse({"--topologyy", "g1n8"}, kSimulate);
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().message(), "--topologyy: unknown option (did you mean --topology?)");
  args = Args::Parse({"--steps", "2", "--seeed=3"}, kSimulate);
  EXPECT_EQ(args.status().message(), "--seeed: unknown option (did you mean --seed?)");
  // Before looking for its value: the typo is the problem, not a missing value.
  args = Args::Parse({"--topologyy"}, kSimulate);
  EXPECT_EQ(args.status().message(), "--topologyy: unknown option (did you mean --topology?)");
  // --help is every command's.
  args = Args::Parse({"--hlep"}, kSimulate);
  EXPECT_EQ(args.status().message(), "--hlep: unknown option (did you mean --help?)");
}

TEST(ArgsTest, AnUnknownOptionWithNothingCloseListsTheKnownOnes) {
  auto args = Args::Parse({"--bogus", "1"}, std::vector<std::string>{"input", "rank"});
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().message(),
            "--bogus: unknown option (known: --input, --rank; --help for the usage)");
  args = Args::Parse({"--bogus", "1"}, std::vector<std::string>{});
  EXPECT_EQ(args.status().message(),
            "--bogus: unknown option (this command takes none; --help for its usage)");
}

TEST(ArgsTest, AnOptionWithOneDashIsNamed) {
  auto args = Args::Parse({"-topology", "g1n8"}, kSimulate);
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().message(), "unexpected argument '-topology' (did you mean --topology?)");
  args = Args::Parse({"-stpes=3"}, kSimulate);
  EXPECT_EQ(args.status().message(), "unexpected argument '-stpes=3' (did you mean --steps?)");
  args = Args::Parse({"g1n8"}, kSimulate);
  EXPECT_EQ(args.status().message(), "unexpected argument 'g1n8' (options are --name value)");
}

TEST(ArgsTest, AMissingValueIsNotTheNextOption) {
  auto args = Args::Parse({"--steps"}, kSimulate);
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().message(), "--steps: missing value");
  args = Args::Parse({"--topology", "--steps", "3"}, kSimulate);
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().message(), "--topology: missing value");
  // A negative number is a value.
  args = Args::Parse({"--seed", "-1"}, kSimulate);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_EQ(args->GetString("seed", ""), "-1");
}

TEST(ArgsTest, RepeatedOptionsAreErrors) {
  auto args = Args::Parse({"--steps", "3", "--steps=4"}, kSimulate);
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().message(), "--steps: given twice");
}

TEST(ArgsTest, SwitchesTakeNoValue) {
  const std::vector<OptionSpec> options = {{"input", "FILE", "", "the request"},
                                           {"pretty", "", "", "indent"}};
  auto args = Args::ParseOptions({"--pretty", "--input", "x.json"}, options);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_TRUE(args->Has("pretty"));
  EXPECT_EQ(args->GetString("input", ""), "x.json");
  args = Args::ParseOptions({"--input", "x.json"}, options);
  ASSERT_TRUE(args.ok()) << args.status();
  EXPECT_FALSE(args->Has("pretty"));
  args = Args::ParseOptions({"--pretty=yes"}, options);
  ASSERT_FALSE(args.ok());
  EXPECT_EQ(args.status().message(), "--pretty: takes no value, got 'yes'");
  // A switch does not swallow the next argument.
  args = Args::ParseOptions({"--pretty", "x.json"}, options);
  ASSERT_FALSE(args.ok());
  EXPECT_THAT(std::string(args.status().message()), HasSubstr("unexpected argument 'x.json'"));
}

TEST(ArgsTest, WantsHelpAnywhere) {
  EXPECT_TRUE(Args::WantsHelp({"--help"}));
  EXPECT_TRUE(Args::WantsHelp({"-h"}));
  EXPECT_TRUE(Args::WantsHelp({"--topologyy", "x", "--help"}));
  EXPECT_FALSE(Args::WantsHelp({}));
  EXPECT_FALSE(Args::WantsHelp({"--helpful", "x", "-hh", "help"}));
}

TEST(FormatUsageTest, OneLinePerOptionWithItsDefault) {
  const std::vector<OptionSpec> options = {
      {"steps", "N", "20", "batches per topology"},
      {"max-tokens-per-gpu", "N", "", "cap on the tokens of one GPU"},
      {"pretty", "", "", "indent the JSON"},
  };
  const std::string usage =
      FormatUsage("tool run [options]\ntool run --other", "Runs it.\n", options);
  EXPECT_EQ(usage,
            "usage: tool run [options]\n"
            "       tool run --other\n"
            "\n"
            "Runs it.\n"
            "\n"
            "options:\n"
            "  --steps N               batches per topology (default 20)\n"
            "  --max-tokens-per-gpu N  cap on the tokens of one GPU\n"
            "  --pretty                indent the JSON\n"
            "  -h, --help              print this text and exit\n");
}

TEST(FormatUsageTest, AVeryLongOptionDoesNotWidenTheOthers) {
  const std::vector<OptionSpec> options = {
      {"a", "N", "", "short"},
      {"an-option-name-far-longer-than-any-other", "VALUE", "", "long"},
  };
  const std::string usage = FormatUsage("t", "d", options);
  EXPECT_THAT(usage, HasSubstr("\n  --a N       short\n"));
  EXPECT_THAT(usage, HasSubstr("\n  --an-option-name-far-longer-than-any-other VALUE  long\n"));
  EXPECT_THAT(usage, Not(HasSubstr("--a N                ")));
}

TEST(OptionNamesTest, InDeclarationOrder) {
  EXPECT_THAT(OptionNames({{"b", "N", "", ""}, {"a", "", "", ""}}), ElementsAre("b", "a"));
}

}  // namespace
}  // namespace knapformer
