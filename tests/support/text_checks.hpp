// Small checks on the words a test gets back (error messages, command output).
#pragma once

#include <string_view>

namespace gpuverbs::test {

/// Whether `text` contains `part`.
inline bool contains(std::string_view text, std::string_view part) {
    return text.find(part) != std::string_view::npos;
}

} // namespace gpuverbs::test
