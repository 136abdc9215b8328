#include "core/json_text.h"

#include <algorithm>

#include "core/error.h"

namespace ptllm {

nlohmann::json parse_json_text(std::string_view text, const std::string& file) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte counts the bytes read, the offending one included (1-based).
    const size_t at = std::min(e.byte > 0 ? size_t(e.byte - 1) : 0, text.size());
    const size_t line = 1 + size_t(std::count(text.begin(), text.begin() + std::ptrdiff_t(at), '\n'));
    const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
    const size_t column = line_start == std::string_view::npos || at == 0 ? at + 1 : at - line_start;
    std::string why = e.what();  // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ..."
    if (const size_t colon = why.find(": "); colon != std::string::npos) why = why.substr(colon + 2);
    throw Error(file + ": not valid JSON at line " + std::to_string(line) + ", column " + std::to_string(column) +
                " (" + why + ")");
  } catch (const nlohmann::json::exception& e) {
    throw Error(file + ": not valid JSON (" + std::string(e.what()) + ")");
  }
}

}  // namespace ptllm
