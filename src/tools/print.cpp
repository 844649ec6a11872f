#include <mpiml/print.hpp>

#include <cstdio>
#include <string>

namespace mpiml {

void msg(std::string_view m, std::string_view string) {
    std::string line = "Message from " + std::to_string(proc_id()) + ": ";
    line.append(string);
    line += " \t ";
    line.append(m);
    line += '\n';
    std::fwrite(line.data(), 1, line.size(), stdout);
    std::fflush(stdout);
}

void pprint(std::string_view input_str, std::string_view end, Comm comm) {
    if (proc_id(comm) != 0) return;
    std::string out(input_str);
    out.append(end);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
}

}  // namespace mpiml
