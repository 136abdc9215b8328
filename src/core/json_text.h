#pragma once
// JSON documents this runtime did not write (config.json, a shard index): a syntax error names the
// file, the line and the column, as an editor shows them.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace ptllm {

// Throws ptllm::Error "FILE: not valid JSON at line L, column C (what the parser expected)".
nlohmann::json parse_json_text(std::string_view text, const std::string& file);

}  // namespace ptllm
