#pragma once
// JSON <-> template values. Objects keep their key order (nlohmann::ordered_json), as Python's
// json.loads does: a tool schema printed with tojson must come out in the order it came in.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "chat/value.h"

namespace ptllm::chat {

using Json = nlohmann::ordered_json;

Value from_json(const Json& j);

struct JsonDumpOptions {
  std::optional<std::string> indent;  // json.dumps(indent=): None, or the text of one level
  std::string item_sep = ", ";        // separators=(item, key); with indent the item one is ","
  std::string key_sep = ": ";
  bool ensure_ascii = false;  // transformers' tojson default
  bool sort_keys = false;
};

// Python's json.dumps(value, ...), byte for byte; Undefined, namespaces and callables throw
// EvalError ("Object of type ... is not JSON serializable"), as Python raises TypeError.
std::string dump_json(const Value& v, const JsonDumpOptions& opt);

}  // namespace ptllm::chat
