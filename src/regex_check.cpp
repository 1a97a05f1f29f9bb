// Whether std::regex accepts a pattern: llama.cpp compiles lazy-grammar trigger patterns with
// std::regex outside any try block, so an invalid one would throw across its C interface and
// end the process. llamactx asks this function, compiled with the same standard library, first.
#include <cstddef>
#include <regex>
#include <string>

extern "C" int llamactx_regex_is_valid(const char * pattern, std::size_t length) {
    try {
        std::regex compiled(std::string(pattern, length));
        (void) compiled;
        return 1;
    } catch (...) {
        return 0;
    }
}
