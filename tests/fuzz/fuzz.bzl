"""kf_fuzzer: one libFuzzer target and the regression test over its corpus.

For a fuzzer NAME (NAME.cc defines LLVMFuzzerTestOneInput, corpus/NAME/
holds its seeds):
  NAME_corpus_test  cc_test in the default build: runs the entry point over
                    every file of the corpus (gcc, no libFuzzer), so every
                    seed and every crash turned into a seed is a regression
                    test of the ordinary suite.
  NAME              cc_binary, tagged manual: built only under
                    `--config=fuzz` (clang, -fsanitize=fuzzer,address,undefined).
"""

def kf_fuzzer(name, deps):
    native.cc_library(
        name = name + "_entry",
        testonly = True,
        srcs = [name + ".cc"],
        deps = deps + [":fuzz_check"],
        alwayslink = True,
    )
    native.cc_test(
        name = name + "_corpus_test",
        srcs = ["corpus_test_main.cc"],
        args = ["tests/fuzz/corpus/" + name],
        data = native.glob(["corpus/" + name + "/*"]),
        deps = [
            ":" + name + "_entry",
            "//third_party:gtest",
        ],
    )
    native.cc_binary(
        name = name,
        testonly = True,
        tags = ["manual", "fuzzer"],
        deps = [":" + name + "_entry"],
    )
