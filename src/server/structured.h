#pragma once
// Structured output for a request: its grammar, JSON Schema or JSON response_format, calls forced
// by tool_choice ("required", a named function), and strict tools' arguments, compiled into one
// grammar over the text the model writes (engine/constraint.h).
//
// Calls are written in the model's own syntax (the reply format read from its chat template):
//   hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   llama3       {"name": "f", "parameters": {...}}
//   mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}]
//   qwen3-coder  <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>
// so the reply parser (engine/chat_output.h) reads them as it reads unconstrained calls. A tool's
// arguments follow its `parameters` schema when the call is forced or the tool is strict; otherwise
// they are any JSON object. With tool_choice "auto" and strict tools, the grammar is lazy: it
// starts at the format's call marker and the text around calls stays free.
#include <memory>

#include "engine/constraint.h"
#include "server/api.h"
#include "tokenizer/tokenizer.h"

namespace ptllm::server {

// Null when the request constrains nothing. Throws ApiError (400) naming the field: a grammar's
// line and column, a JSON Schema keyword that cannot be honoured, a grammar too large, or one that
// matches no text.
std::shared_ptr<const ConstraintSpec> request_constraint(const ApiRequest& r, const Tokenizer& tok);

}  // namespace ptllm::server
