// Test helper shared by the LibTorch tests: an mpiml::Error with given words.
#pragma once

#include <mpiml/mpiml.hpp>

#include <gtest/gtest.h>

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
            for (std::size_t b = 0; !found; b = n.find('|', b) + 1) {
                const std::size_t e = n.find('|', b);
                found = what.find(n.substr(b, e == std::string::npos ? e : e - b)) != std::string::npos;
                if (e == std::string::npos) break;
            }
            EXPECT_TRUE(found) << "'" << n << "' not in: " << what;
        }
    }
}

}  // namespace mpiml_test
