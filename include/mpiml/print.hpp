// Rank-aware printing.
#pragma once

#include <mpiml/session.hpp>

#include <string_view>

namespace mpiml {

/// Every rank prints "Message from <rank>: <string> \t <m>" (one write, so
/// lines of different ranks do not interleave).
void msg(std::string_view m, std::string_view string = "");

/// Rank 0 of comm alone prints input_str followed by end, and flushes.
void pprint(std::string_view input_str = "", std::string_view end = "\n", Comm comm = {});

}  // namespace mpiml
