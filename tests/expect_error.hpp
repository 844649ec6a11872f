// Test helper shared by the LibTorch tests: an mpiml::Error with given words.
#pragma once

#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace mpiml_test {

/// Expects `fn` to throw mpiml::Error whose message contains every needle
/// (rank 0 prints the message). A needle "a|b" is met by either word.
template <class F>
void expect_error(F&& fn, const std::vector<std::string>& needles) {
    try {
        fn();
        ADD_FAILURE() << "no mpiml::Error thrown";
    } catch (const mpiml::Error& e) {
        const std::string what = e.what();
        if (mpiml::proc_id() == 0) std::printf("  mpiml::Error: %s\n", what.c_str());
        for (const auto& n : needles) {
            bool found = false;
            std::size_t b = 0;
            for (std::size_t e; !found && b <= n.size(); b = e + 1) {
                e = std::min(n.find('|', b), n.size());
                found = what.find(n.substr(b, e - b)) != std::string::npos;
            }
            EXPECT_TRUE(found) << "'" << n << "' not in: " << what;
        }
    }
}

}  // namespace mpiml_test
